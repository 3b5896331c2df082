"""Routing: chat through ``ded/<slug>`` to the endpoint's own Serve app."""
