"""The neutral contract between the gateway (``serve_app``) and its heads (``deployments``).

Both sides import this package; it imports neither (only the standard library
and pydantic). It holds what crosses a DeploymentHandle and what both sides must
agree on: the error vocabulary a head reports and the gateway renders.
"""
