"""The production-shaped stack of tests/production, started as docs/deployment.md says.

``gateway run --config configs/production-local.yaml --ingress proxy`` in a process group
of its own: two gateway replicas behind Serve's proxy, the real SmolLM2 and all-MiniLM
heads, deployment_mode production. Its state is private to the stack: a PostgreSQL server of its
own (``tests.faults.services.PostgresServer``: a test may restart it), a Redis server of its own
on a free port (``tests.faults.services.RedisServer``: a test may stop it without touching
the machine's shared Redis), and an S3 bucket on moto's server (production refuses the
local object folder). Every process the gateway starts (Ray's daemons, replicas, vLLM
engines) carries ``STACK_MARK`` in its environment, so teardown finds and ends them all
by that mark, never by name.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy as sa

from serve_app.auth.accounts import AccountStore
from serve_app.config import REPO_ROOT
from serve_app.ingress.replica_header import REPLICA_HEADER
from serve_app.storage.db import Database
from tests.faults.services import PostgresServer, RedisServer, free_port
from tests.fixtures.processes import pids_with_environ

CONFIG = REPO_ROOT / "configs" / "production-local.yaml"
CHAT = "smollm2-135m-instruct"
EMBED = "all-minilm-l6-v2"
BUCKET = "gw-prod-stack"
STACK_MARK = "GATEWAY_PROD_STACK_MARK"
"""Environment variable set (to a random value) for the gateway and so for all its processes."""
START_TIMEOUT_S = 600.0
"""Two vLLM engines and two gateway replicas on two cores: ~2 min idle; each engine took
~3 min on a box at load 20 (other jobs), and the pooling head longer."""
PROBE_TIMEOUT_S = 10.0
"""One readiness probe: a call to a head still starting may wait for it rather than answer."""
CALL_TIMEOUT_S = 120.0
GATEWAY_TITLE = "ServeReplica:gateway:Gateway"
"""Ray's process title of a gateway replica (checked before a PID is signalled)."""


def wait_for(what: str, check: Callable[[], Any], timeout: float, every: float = 0.25) -> Any:
    """``check()``'s first truthy value, or an AssertionError naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(every)


def replica(resp: httpx.Response) -> str:
    """The gateway replica that answered (``x-service-replica``)."""
    value = resp.headers.get(REPLICA_HEADER)
    assert value, f"no {REPLICA_HEADER} on {resp.status_code} {resp.text[:200]}"
    return value


def worker_pid(worker_id: str) -> int:
    """A batch worker's id is ``<host>-<pid>-<random>`` (``serve_app.batches.worker``)."""
    return int(worker_id.rsplit("-", 2)[1])


def process_title(pid: int) -> str:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    return ""


@dataclass
class MotoS3:
    """moto's S3 server in a child process, with the stack's bucket created."""

    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        moto = Path(sys.executable).parent / "moto_server"
        command = [str(moto) if moto.exists() else "moto_server", "-H", "127.0.0.1"]
        self.process = subprocess.Popen(
            [*command, "-p", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        wait_for("moto's S3 server", self._up, 30.0)
        import boto3

        s3 = boto3.client(
            "s3",
            endpoint_url=self.url,
            region_name="us-east-1",
            aws_access_key_id="test",
            aws_secret_access_key="test",
        )
        s3.create_bucket(Bucket=BUCKET)

    def _up(self) -> bool:
        try:
            return httpx.get(self.url, timeout=1.0).status_code < 500
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=10)


@dataclass
class ProductionStack:
    """The running stack and what its tests read beside the API (database, processes)."""

    base_url: str
    database_url: str
    postgres: PostgresServer
    redis: RedisServer
    log: Path
    mark: str
    db: Database
    accounts: AccountStore
    admin_key: str

    def http(self, key: str | None = None, timeout: float = CALL_TIMEOUT_S) -> httpx.Client:
        return httpx.Client(
            base_url=self.base_url,
            headers={"Authorization": f"Bearer {key or self.admin_key}"},
            timeout=timeout,
        )

    def key(self, user: str, *, rpm: int | None = None, daily_tokens: int | None = None) -> str:
        """A new key of a new user in a new organization (its own counters and ledger)."""
        raw = self.accounts.create_key(user, f"{user}-org", rpm=rpm)
        if daily_tokens is not None:
            self.accounts.update_user(user, daily_tokens=daily_tokens)
        return raw

    def scalar(self, query: str, **params: Any) -> Any:
        with self.db.engine.connect() as conn:
            return conn.execute(sa.text(query), params).scalar()

    def rows(self, query: str, **params: Any) -> list[sa.Row[Any]]:
        with self.db.engine.connect() as conn:
            return list(conn.execute(sa.text(query), params))

    def stragglers(self) -> list[int]:
        """Live processes carrying this stack's mark (Ray workers re-title themselves;
        their environment keeps the mark)."""
        return pids_with_environ(f"{STACK_MARK}={self.mark}")

    def gateway_pids(self) -> list[int]:
        return [p for p in self.stragglers() if GATEWAY_TITLE in process_title(p)]


def stack_env(
    database_url: str, redis_url: str, s3: MotoS3, state: Path, mark: str
) -> dict[str, str]:
    """The gateway's environment: what configs/production-local.yaml's header lists."""
    from deployments.local_models.prepared_models import prepare_in_child

    models = prepare_in_child(CHAT).parent  # converted once per machine, shared with tests/serve
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GATEWAY_", "RAY_"))}
    env.update(
        {
            "GATEWAY_DATABASE_URL": database_url,
            "GATEWAY_REDIS_URL": redis_url,
            "GATEWAY_OBJECT_STORE": "s3",
            "GATEWAY_S3_BUCKET": BUCKET,
            "GATEWAY_S3_ENDPOINT_URL": s3.url,
            "GATEWAY_S3_ADDRESSING_STYLE": "path",
            "GATEWAY_S3_REGION": "us-east-1",
            "GATEWAY_S3_ACCESS_KEY_ID": "test",
            "GATEWAY_S3_SECRET_ACCESS_KEY": "test",
            "GATEWAY_AUTH_CACHE_SECONDS": "60",  # configs/production.yaml's
            "GATEWAY_STATE_DIR": str(state),
            "GATEWAY_MODELS_DIR": str(models),
            "HF_HUB_OFFLINE": "1",
            "PYTHONPATH": f"{REPO_ROOT}:{os.environ.get('PYTHONPATH', '')}",
            STACK_MARK: mark,
        }
    )
    return env


@contextlib.contextmanager
def running_stack(postgres: PostgresServer, workdir: Path) -> Iterator[ProductionStack]:
    """Start everything, wait until both replicas and both heads answer, end it all after."""
    from serve_app.auth.accounts import AccountStore

    database_url = postgres.create_database(f"gw_prod_{secrets.token_hex(6)}")
    redis = RedisServer(_redis_binary())
    s3 = MotoS3()
    mark = secrets.token_hex(16)
    port = free_port()
    log = workdir / "gateway-run.log"
    process: subprocess.Popen[bytes] | None = None
    db = Database(database_url)
    stack: ProductionStack | None = None
    try:
        redis.start()
        s3.start()
        db.migrate()  # before `gateway run` (it migrates too): never two migrations at once
        accounts = AccountStore(db, pepper="")
        admin_key = accounts.create_key("prod-admin", "prod-admin-org")
        env = stack_env(database_url, redis.url, s3, workdir / "state", mark)
        command = [sys.executable, "-m", "serve_app.cli", "run", "--config", str(CONFIG)]
        command += ["--ingress", "proxy", "--port", str(port), "--no-dashboard", "--skip-check"]
        with log.open("ab") as out:
            process = subprocess.Popen(
                command,
                env=env,
                cwd=REPO_ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        stack = ProductionStack(
            base_url=f"http://127.0.0.1:{port}",
            database_url=database_url,
            postgres=postgres,
            redis=redis,
            log=log,
            mark=mark,
            db=db,
            accounts=accounts,
            admin_key=admin_key,
        )
        _wait_ready(stack, process)
        yield stack
    finally:
        if process is not None:
            _stop_gateway(process)
        if stack is not None:
            for pid in stack.stragglers():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        redis.stop()
        s3.stop()
        db.dispose()


def _redis_binary() -> str:
    from tests.faults.services import redis_binary

    return redis_binary()


def _wait_ready(stack: ProductionStack, process: subprocess.Popen[bytes]) -> None:
    """Both heads answer, and answers came from two different gateway replicas."""
    seen: set[str] = set()

    def ready() -> bool:
        if process.poll() is not None:
            raise AssertionError(f"gateway run exited: {stack.log.read_text()[-4000:]}")
        try:
            with stack.http(timeout=PROBE_TIMEOUT_S) as http:
                chat = http.post(
                    "/v1/chat/completions",
                    json={
                        "model": CHAT,
                        "messages": [{"role": "user", "content": "Hi"}],
                        "max_tokens": 1,
                    },
                )
                embed = http.post("/v1/embeddings", json={"model": EMBED, "input": "Hi"})
        except httpx.HTTPError:
            return False
        for resp in (chat, embed):
            if resp.status_code == 200:
                seen.add(replica(resp))
        return chat.status_code == embed.status_code == 200 and len(seen) == 2

    wait_for("both heads and both gateway replicas", ready, START_TIMEOUT_S, every=1.0)


def _stop_gateway(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to ``gateway run`` alone (it stops Serve, then Ray, as on Ctrl-C); SIGKILL of
    its group if it hangs. What is left after either is found by the stack's mark."""
    process.terminate()
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
