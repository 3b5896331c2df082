"""What a route receives, below the routes: the request dependencies.

The caller dependencies and the typed ``State`` (``deps.py``), the replica's
``GatewayState`` (``state.py``), the error responses every route documents and the
OpenAPI document's fixes (``openapi.py``), and the ``Idempotency-Key`` answer store
(``replays.py``, built by the composition root). The routes import these; the app
assembly above the routes (``serve_app.ingress``: the Serve class, middleware, the
error mapper) imports the routes and these. Nothing here imports a route or the
assembly, so no arrow climbs back (``tests/unit/test_import_direction.py``).
"""
