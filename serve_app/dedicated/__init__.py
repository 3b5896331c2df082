"""Dedicated endpoints: private, autoscaled Ray Serve applications under ``/api/dedicated``.

Kept import-light on purpose: ``serve_app.config`` and the wire formats import
small modules of this package, so nothing here may pull in Ray or the database.
See ``docs/api.md`` (Dedicated endpoints) and ``ARCHITECTURE.md`` for the shape.
"""
