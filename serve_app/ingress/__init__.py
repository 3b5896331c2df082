"""The app assembly, above the routes: the Serve ingress class (``deployment.py``), the
FastAPI app and its middleware order (``app.py``), the one error mapper (``errors.py``).

What the routes themselves import (caller dependencies, ``GatewayState``, the OpenAPI
error responses, the replay store) sits below them in ``serve_app.requests``; only the
Serve builder and the CLI import this package.
"""
