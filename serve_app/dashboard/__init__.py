"""The dashboard console at ``/dashboard`` (docs/dashboard.md).

Server-rendered pages whose data comes from the JSON API (``/api``, ``/v1``) called by a
little JavaScript with the session cookie; the package holds its templates and static
assets, so the console works with no network beyond the gateway.
"""
