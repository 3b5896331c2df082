"""``/v1/batches``: OpenAI's Batch API, run by lease-holding workers on idle capacity."""
