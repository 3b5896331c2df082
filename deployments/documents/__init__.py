"""Document heads (detect and parse): the engine contracts (``base``), the backend factory
(``factory``), the backends (``hf_engine``: transformers models; ``rapid_engine``: ONNX
models shipped in wheels) and the Serve deployment (``head``)."""
