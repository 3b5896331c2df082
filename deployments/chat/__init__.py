"""Chat heads: the text engine contract (``base``), the backend factory (``factory``), the
vLLM backend (``vllm_config``, ``vllm_engine``, ``vllm_openai``, ``tool_parsers``,
``chat_templates/``), the chat head's helpers (``adapters``: LoRA slots,
``invented_calls``) and the Serve deployment (``head``)."""
