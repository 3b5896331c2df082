"""The ``/api/dedicated`` API: operations that store desired state, and the views of it."""
