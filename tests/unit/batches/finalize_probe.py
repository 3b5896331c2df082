"""Run in a fresh process by ``test_batch_memory.py``: finalize one batch and report the
process's resident memory when idle and its peak while finalizing, as JSON on stdout.

``python -m tests.unit.batches.finalize_probe DATABASE_URL OBJECTS_DIR ISO_NOW``. The peak
is exact when finalizing raised the process's lifetime peak (``ru_maxrss``), else it is
the highest of samples of the resident size taken every millisecond.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import resource
import sys
import threading
from datetime import datetime
from pathlib import Path
from typing import Any

from serve_app.batches.store import BatchStore
from serve_app.batches.worker import BatchWorker
from serve_app.config import BatchOptions
from serve_app.files.store import FileStore
from serve_app.storage.db import Database
from serve_app.storage.objects import LocalObjectStore

PAGE = os.sysconf("SC_PAGE_SIZE")


def rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * PAGE


class Sampler(threading.Thread):
    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.peak = rss()
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.001):
            self.peak = max(self.peak, rss())


def main(database_url: str, objects_dir: str, now: str) -> dict[str, Any]:
    database = Database(database_url)
    unused: Any = None
    worker = BatchWorker(
        BatchStore(database),
        FileStore(database),
        LocalObjectStore(Path(objects_dir)),
        unused,
        lambda _key: None,
        unused,
        unused,
        BatchOptions(),
        clock=lambda: datetime.fromisoformat(now),
        worker_id="probe",
    )
    gc.collect()
    idle = rss()
    lifetime_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    sampler = Sampler()
    sampler.start()
    staged = asyncio.run(worker.run_stage())
    sampler.done.set()
    sampler.join()
    lifetime_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    peak = lifetime_after if lifetime_after > lifetime_before else max(sampler.peak, rss())
    database.dispose()
    return {"staged": staged, "idle": idle, "peak": peak}


if __name__ == "__main__":
    print(json.dumps(main(*sys.argv[1:4])))
