"""Speech and transcription heads: the audio engine contracts (``base``), the backend
factory (``factory``), audio decoding and encoding (``audio_io``), the backends
(``whisper_engine``, ``piper_engine``, ``orpheus_engine``) and the Serve deployments
(``speech_head``, ``transcription_head``)."""
