"""One production-shaped stack (``tests.production.stack``) for the whole package.

Started once (~2 min on two cores) and shared: the invariant tests (test_stack_e2e.py)
run first on it, then the fault tests (test_stack_faults.py), each of which leaves the
stack serving again (a killed replica is replaced by Serve, a stopped Redis restarted).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.faults.services import PostgresServer, throwaway_postgres
from tests.production.stack import ProductionStack, running_stack


@pytest.fixture(scope="package")
def prod_postgres() -> Iterator[PostgresServer]:
    """The stack's own PostgreSQL (a fault test stops and restarts it; the machine's server
    is shared with everything else on the box)."""
    with throwaway_postgres() as server:
        yield server


@pytest.fixture(scope="package")
def prod_stack(
    prod_postgres: PostgresServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ProductionStack]:
    with running_stack(prod_postgres, tmp_path_factory.mktemp("prod-stack")) as stack:
        yield stack
