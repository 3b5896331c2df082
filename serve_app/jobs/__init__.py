"""Asynchronous video generation jobs: durable records and their store (the service that
submits, polls and reconciles them is ``serve_app.inference.video``)."""
