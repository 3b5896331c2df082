"""Throwaway Redis and PostgreSQL servers that a fault test may stop and start at will.

The machine's own services (Redis on 6379, PostgreSQL on 5432) are shared by every
test and every developer, so outages are never injected there: each server here runs
on a free port in a temporary folder and is removed afterwards. A missing binary
means a skip, not a failure (the fault suite then has nothing to break).

PostgreSQL refuses to run as root, so under root the cluster belongs to the
``postgres`` user and its commands run through ``runuser``.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
import sqlalchemy as sa

PG_BIN_DIRS = [Path("/usr/lib/postgresql") / v / "bin" for v in ("17", "16", "15", "14")]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait(check: Callable[[], bool], what: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.02)
    raise RuntimeError(f"{what} did not happen within {timeout_s} s")


class RedisServer:
    """``redis-server`` without persistence: a restart loses every key, as a Redis
    with ``--save "" --appendonly no`` (a cache-style deployment) does."""

    def __init__(self, binary: str) -> None:
        self.binary = binary
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._process: subprocess.Popen[bytes] | None = None

    def _ping(self) -> bool:
        client = redis.Redis(port=self.port, socket_connect_timeout=0.5)
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False
        finally:
            client.close()

    def start(self) -> None:
        command = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1"]
        command += ["--save", "", "--appendonly", "no", "--daemonize", "no"]
        self._process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        _wait(self._ping, f"redis-server on port {self.port} answering")

    def stop(self) -> None:
        """SIGTERM (a clean shutdown, as a restart by an operator or a failover does)."""
        process, self._process = self._process, None
        if process is not None:
            process.terminate()
            process.wait(timeout=10)

    @property
    def running(self) -> bool:
        return self._process is not None


class PostgresServer:
    """A PostgreSQL cluster of its own (trust auth, no fsync: nothing here must survive)."""

    def __init__(self, bin_dir: Path) -> None:
        self.bin_dir = bin_dir
        self.port = free_port()
        self.folder = Path(tempfile.mkdtemp(prefix="gw-fault-pg-"))
        self.data = self.folder / "data"
        self.admin_url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"
        self._owner = "postgres" if os.geteuid() == 0 else None
        if self._owner is not None:
            user = pwd.getpwnam(self._owner)
            os.chown(self.folder, user.pw_uid, user.pw_gid)
        self.running = False

    def _run(self, tool: str, *args: str) -> None:
        command = [str(self.bin_dir / tool), *args]
        if self._owner is not None:
            command = ["runuser", "-u", self._owner, "--", *command]
        done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=60)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)}: rc={done.returncode} {done.stderr.strip()}")

    def init(self) -> None:
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "-N")

    def start(self) -> None:
        options = (
            f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1 "
            "-c fsync=off -c full_page_writes=off"
        )
        log = str(self.folder / "server.log")
        self._run("pg_ctl", "-D", str(self.data), "-o", options, "-l", log, "-w", "start")
        self.running = True

    def stop(self) -> None:
        """``-m fast``: open sessions are cut at once, as when a server goes down."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")
        self.running = False

    def create_database(self, name: str) -> str:
        admin = sa.create_engine(self.admin_url, isolation_level="AUTOCOMMIT")
        try:
            with admin.connect() as conn:
                conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
        finally:
            admin.dispose()
        return self.admin_url.rsplit("/", 1)[0] + f"/{name}"

    def remove(self) -> None:
        if self.running:
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                self.stop()
        shutil.rmtree(self.folder, ignore_errors=True)


@contextlib.contextmanager
def throwaway_postgres() -> Iterator[PostgresServer]:
    """A started ``PostgresServer``, removed (stopped, its folder deleted) afterwards."""
    server = PostgresServer(postgres_bin_dir())
    try:
        server.init()
        server.start()
        yield server
    finally:
        server.remove()


def redis_binary() -> str:
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed: no Redis outage to inject")
    return binary


def postgres_bin_dir() -> Path:
    found = [d for d in PG_BIN_DIRS if (d / "initdb").exists() and (d / "pg_ctl").exists()]
    on_path = shutil.which("pg_ctl")
    if not found and on_path is not None:
        found = [Path(on_path).resolve().parent]
    if not found:
        pytest.skip("PostgreSQL server binaries (initdb, pg_ctl) are not installed")
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("running as root without a postgres user: initdb would refuse")
        if shutil.which("runuser") is None:
            pytest.skip("running as root without runuser: cannot start PostgreSQL")
    return found[0]
