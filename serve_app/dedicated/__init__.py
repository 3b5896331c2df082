"""Dedicated endpoints: private, autoscaled Ray Serve applications under ``/api/dedicated``.

The package by what each part does (``ARCHITECTURE.md``, "Dedicated endpoints"):

- ``api``: the ``/api/dedicated`` operations (``operations``, ``redeploy``), what callers
  see (``views``, ``telemetry``) and the ``facade`` routes call and the root wires;
- ``control``: the ``reconciler`` that converges Ray Serve to the stored endpoints, the
  ``backend`` protocol it drives Serve through, its Ray implementation
  (``ray_backend``), replica deaths from Ray's records and the custom autoscaling policy;
- ``routing``: chat through ``ded/<slug>`` (alias resolution, admission, per-call
  records) and the reserved floor's shared call counts;
- ``pricing``: the rate card arithmetic (``rates``) and the replica lifetimes billed
  from Serve's state (``meter``);
- ``offer``: what the catalog offers for dedicated use (``catalog``), its engine
  settings (``engine``) and scaling policies (``scaling``).

The API itself: docs/reference/dedicated.md. Shared by all of them: ``alias`` (names),
``options`` (the operator's ``dedicated:`` section), ``store`` (the SQL tables) and
``context`` (what the long-lived parts are built on).

Kept import-light on purpose: ``serve_app.config`` and the wire formats import
small modules of this package, so no ``__init__`` here may pull in Ray or the database.
"""
