"""What the catalog offers for dedicated use: models, engine settings, scaling policies."""
