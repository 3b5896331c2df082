"""LoRA adapters per organization: upload, list, delete, and resolution of
``<base model>:<adapter>`` ids (docs/reference/adapters.md)."""
