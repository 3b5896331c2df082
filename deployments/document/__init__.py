"""Document heads (detect and parse): the engine contracts (``base``), the backend factory
(``factory``), the backends (``hf_engines``: transformers models; ``rapid_engines``: ONNX
models shipped in wheels) and the Serve deployment (``head``)."""
