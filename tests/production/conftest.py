"""One production-shaped stack (``tests.production.stack``) for the whole package.

Started once (~2 min on two cores) and shared: the invariant tests (test_stack_e2e.py)
run first on it, then the fault tests (test_stack_faults.py), each of which leaves the
stack serving again (a killed replica is replaced by Serve, a stopped Redis restarted).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.production.stack import ProductionStack, running_stack


@pytest.fixture(scope="package")
def prod_stack(
    postgres_admin_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ProductionStack]:
    with running_stack(postgres_admin_url, tmp_path_factory.mktemp("prod-stack")) as stack:
        yield stack
