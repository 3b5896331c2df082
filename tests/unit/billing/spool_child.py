"""A gateway replica that dies (SIGKILL) at a chosen point of the ledger's write path.

Run by ``test_ledger.py``: ``python -m tests.unit.billing.spool_child DB SPOOL MODE N``.
It spools N records, prints ``spooled``, then:

- ``before-commit``: the flusher inserts the batch and the process is killed
  inside the transaction, before the commit;
- ``after-commit``: the process is killed right after the commit, before the
  spool file is deleted.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from serve_app.billing.ledger import UsageLedger
from serve_app.billing.records import UsageRecord
from serve_app.billing.store import LedgerStore
from serve_app.storage.db import Database
from tests.unit.billing.records import make_record


class DieBeforeCommit(LedgerStore):
    def insert(self, records: Sequence[UsageRecord]) -> None:
        with self._db.begin() as conn:
            conn.execute(self._insert(), [r.to_row() for r in records])
            os.kill(os.getpid(), signal.SIGKILL)


class DieAfterCommit(LedgerStore):
    def insert(self, records: Sequence[UsageRecord]) -> None:
        super().insert(records)
        os.kill(os.getpid(), signal.SIGKILL)


async def main(db_url: str, spool: str, mode: str, count: int) -> None:
    db = Database(db_url)
    store = DieBeforeCommit(db) if mode == "before-commit" else DieAfterCommit(db)
    ledger = UsageLedger(store, Path(spool), flush_interval_s=3600)
    for i in range(count):
        ledger.submit(make_record(f"req-{i}"))
    print("spooled", flush=True)
    await ledger.flush()
    print("survived", flush=True)  # never reached


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])))
