"""Asynchronous video generation jobs: durable state, the per-user cap, reconciliation."""
