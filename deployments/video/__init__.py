"""Video heads: the engine contract (``base``), the backend factory (``factory``), the
diffusers backends (``diffusers_engine``), MP4 encoding (``mp4``) and the Serve deployment
(``head``) that runs video jobs."""
