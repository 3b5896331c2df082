"""A Ray driver in its own process: deploys the gateway on a test cluster and reports state.

One process joins one Ray cluster, and the test session's own Serve instance
(tests/serve/conftest.py) may already hold the pytest process. So the
multi-node tests drive their cluster from this child: it connects, starts
Serve (proxy on the head only), runs the gateway app from a JSON args file,
then answers one JSON line per command on stdin:

- ``status``: every Serve app's replicas (id, deployment, state, node) and
  every node (alive, resources), as the gateway's own backend reads them;
- ``quit``: exit (Serve keeps running on the cluster until it is torn down).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def status() -> dict[str, Any]:
    import ray

    from deployments.dedicated_head import DedicatedHead
    from serve_app.dedicated.control.ray_backend import RayServeBackend

    apps = {
        name: {
            "status": obs.status,
            "replicas": [
                {
                    "replica_id": r.replica_id,
                    "deployment": r.deployment,
                    "state": r.state,
                    "node_id": r.node_id,
                }
                for r in obs.replicas
            ],
        }
        for name, obs in RayServeBackend(DedicatedHead).status().items()
    }
    nodes = {
        n["NodeID"]: {"alive": bool(n["Alive"]), "resources": n.get("Resources") or {}}
        for n in ray.nodes()
    }
    return {"apps": apps, "nodes": nodes}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--address", required=True)
    parser.add_argument("--http-port", type=int, required=True)
    parser.add_argument("--args-file", type=Path, required=True)
    opts = parser.parse_args()
    answers, sys.stdout = sys.stdout, sys.stderr  # stdout carries answers only

    import ray
    from ray import serve

    from serve_app.builders import build_gateway_app

    ray.init(address=opts.address, log_to_driver=False)
    serve.start(
        proxy_location="HeadOnly", http_options={"host": "127.0.0.1", "port": opts.http_port}
    )
    app = build_gateway_app(json.loads(opts.args_file.read_text()))
    serve.run(app, name="gateway", route_prefix="/", blocking=False)
    print(json.dumps({"deployed": True}), file=answers, flush=True)
    for line in sys.stdin:
        command = line.strip()
        if command == "quit":
            break
        try:
            reply: dict[str, Any] = status() if command == "status" else {"error": command}
        except Exception as err:  # report, keep serving: the test decides
            reply = {"error": repr(err)}
        print(json.dumps(reply), file=answers, flush=True)


if __name__ == "__main__":
    main()
