"""CPU time of the processes of a serving stack, read from ``/proc/<pid>/stat``.

A stack is a process tree (``gateway run`` with its Ray daemons and actors, or
vLLM's API server with its engine core). Each process is put in a role from its
command line, Ray actors by the names Ray gives their process titles
(``ray::ProxyActor``, ``ray::ServeReplica:<app>:<deployment>``), so a phase's
CPU seconds can be charged to the Serve proxy, the gateway replica, the head
replica and the engine separately.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass

import psutil

from bench.servers import descendants

CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float | None:
    """utime + stime of ``pid`` (all its threads), or None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rindex(b")") + 2 :].split()  # after "pid (comm) "; comm may hold spaces
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # fields 14 and 15 of proc(5)


def _cmdline(process: psutil.Process) -> str:
    try:
        return " ".join(process.cmdline()).strip() or process.name()
    except psutil.Error:
        return ""


def short_name(cmdline: str) -> str:
    """A command line without interpreter and site-packages paths, cut to 90 characters."""
    line = re.sub(r"\S*/bin/python[\d.]*( -[uB])*( -c)? ", "", cmdline)
    line = re.sub(r"\S*/site-packages/", "", line)
    return line[:90]


def gateway_role(cmdline: str, below_head: bool) -> str:
    """Role of one process of a ``gateway run`` tree."""
    if below_head:
        return "engine"  # vLLM's EngineCore (and anything else the head replica forks)
    if cmdline.startswith("ray::ProxyActor"):
        return "proxy"
    if cmdline.startswith("ray::ServeReplica:") and cmdline.endswith(":Gateway"):
        return "gateway"
    if cmdline.startswith("ray::ServeReplica:"):
        return "head"
    if cmdline.startswith("ray::ServeController"):
        return "serve controller"
    return "ray and driver"  # gateway run, GCS, raylet, dashboard and agents, idle workers


def bare_role(cmdline: str, below_head: bool) -> str:
    """Role of one process of a vLLM API server tree (the root is the API process)."""
    return "engine" if below_head else "api server"


@dataclass(frozen=True)
class Proc:
    pid: int
    role: str
    name: str


def classify(root_pid: int, stack: str) -> list[Proc]:
    """Every process of the tree below ``root_pid``, each with its role.

    ``stack`` is ``gateway`` or ``bare``. The engine is whatever runs below the
    head replica (gateway) or below the API process (bare).
    """
    role_of: Callable[[str, bool], str] = gateway_role if stack == "gateway" else bare_role
    tree = descendants(root_pid)
    if stack == "gateway":
        heads = [p for p in tree if gateway_role(_cmdline(p), False) == "head"]
    else:
        heads = tree[:1]
    under_head = {c.pid for h in heads for c in descendants(h.pid)[1:]}
    found = []
    for process in tree:
        line = _cmdline(process)
        found.append(Proc(process.pid, role_of(line, process.pid in under_head), short_name(line)))
    return found


def snapshot(procs: list[Proc]) -> dict[int, float]:
    """CPU seconds of each process now (processes gone since are left out)."""
    now = {p.pid: cpu_seconds(p.pid) for p in procs}
    return {pid: s for pid, s in now.items() if s is not None}


def by_role(
    procs: list[Proc], before: dict[int, float], after: dict[int, float]
) -> dict[str, float]:
    """CPU seconds spent per role between two snapshots."""
    spent: dict[str, float] = {}
    for p in procs:
        if p.pid in before and p.pid in after:
            spent[p.role] = spent.get(p.role, 0.0) + after[p.pid] - before[p.pid]
    return spent


def by_process(
    procs: list[Proc], before: dict[int, float], after: dict[int, float]
) -> list[tuple[str, str, float]]:
    """(role, command line, CPU seconds) of each process between two snapshots, largest first."""
    rows = [
        (p.role, p.name, after[p.pid] - before[p.pid])
        for p in procs
        if p.pid in before and p.pid in after
    ]
    return sorted(rows, key=lambda row: -row[2])


def threads(pid: int) -> dict[int, tuple[str, float]]:
    """CPU seconds of each thread of ``pid``: {tid: (thread name, seconds)}."""
    found: dict[int, tuple[str, float]] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        name = stat[stat.index(b"(") + 1 : stat.rindex(b")")].decode(errors="replace")
        fields = stat[stat.rindex(b")") + 2 :].split()
        found[int(tid)] = (name, (int(fields[11]) + int(fields[12])) / CLK_TCK)
    return found
