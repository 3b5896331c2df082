"""The neutral contract between the gateway (``serve_app``) and its heads (``deployments``).

Both sides import this package; it imports neither (only the standard library
and pydantic). It holds what crosses a DeploymentHandle and what both sides must
agree on: the error vocabulary a head reports and the gateway renders
(``errors``), the text, audio and document head requests and results (``text``,
``audio``, ``document``), what a dedicated head adds (``dedicated``: the replica
that served a call, replica counters), the video bounds and the store protocols a
video head is given (``video``), the sandbox options and a run's result
(``sandbox``) and the models cache lookup (``paths``).
``tests/unit/test_import_direction.py`` holds the direction.
"""
