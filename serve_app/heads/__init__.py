"""The gateway's side of its heads: how a service reaches a head (``client``), and the
external provider client that stands in for a head (``external``).

Below every service that calls a head (``inference``, ``dedicated``) and
above only the contract: it imports no service, route or ingress, and nothing of
``deployments`` (the heads' cores are built by the composition root or a test).
"""
