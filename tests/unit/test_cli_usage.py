"""``gateway usage``: totals per model and cost from the usage ledger."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from serve_app.auth.accounts import AccountStore
from serve_app.billing.records import UsageQuantities
from serve_app.billing.store import LedgerStore
from serve_app.catalog.config import PricingConfig
from serve_app.cli import main
from serve_app.settings import GatewaySettings
from serve_app.storage.db import Database
from tests.unit.billing.records import make_record


@pytest.fixture
def settings(database_url: str) -> GatewaySettings:
    return GatewaySettings(database_url=database_url)


def seed(settings: GatewaySettings) -> str:
    db = Database.from_settings(settings)
    db.migrate()
    AccountStore(db).create_key("alice", "acme")
    user = AccountStore(db).get_user("alice")
    assert user is not None
    old = datetime(2024, 1, 5, tzinfo=UTC)
    spot = PricingConfig(
        mode="spot", input_per_mtok=2.0, output_per_mtok=4.0, spot_multiplier=0.5, gpu_class="l4"
    )
    LedgerStore(db).insert(
        [
            make_record("a", user_id=user.id, usage=UsageQuantities(100, 40, requests=2)),
            make_record("b", user_id=user.id, usage=UsageQuantities(50, 10, cached_tokens=20)),
            make_record(
                "c", user_id=user.id, model="m2", pricing=spot, usage=UsageQuantities(1000, 500)
            ),
            make_record("d", user_id=user.id, created_at=old, usage=UsageQuantities(7, 7)),
            make_record("e", user_id="someone-else"),
        ]
    )
    db.dispose()
    return user.id


def run(
    capsys: pytest.CaptureFixture[str], settings: GatewaySettings, *argv: str
) -> tuple[int, str]:
    code = main(["usage", *argv], settings=settings)
    return code, capsys.readouterr().out


HEADER = [
    "MODEL",
    "REQUESTS",
    "PROMPT",
    "COMPLETION",
    "CACHED",
    "REASONING",
    "SEARCHES",
    "CODE_S",
    "IMAGES",
    "AUDIO_S",
    "VIDEO_S",
    "COST",
]


def test_totals_per_model_and_cost(
    capsys: pytest.CaptureFixture[str], settings: GatewaySettings
) -> None:
    seed(settings)
    code, out = run(capsys, settings, "--user", "alice", "--since", "2024-06-01")
    assert code == 0
    lines = out.strip().splitlines()
    assert lines[0] == "Usage of user 'alice' since 2024-06-01 (UTC):"
    assert lines[1].split() == HEADER
    # m1: 100*1 + 40*2 + 50*1 + 10*2 = 250 per million; m2 spot: (1000*2 + 500*4) * 0.5 = 2000.
    zeros = ["0", "0.00", "0", "0.00", "0.00"]
    assert lines[2].split() == ["m1", "3", "150", "50", "20", "0", *zeros, "0.000250", "eur"]
    assert lines[3].split() == ["m2", "1", "1000", "500", "0", "0", *zeros, "0.002000", "eur"]
    assert lines[4].split() == ["TOTAL", "4", "1150", "550", "20", "0", *zeros, "0.002250", "eur"]


def test_units_other_than_tokens_have_columns(
    capsys: pytest.CaptureFixture[str], settings: GatewaySettings
) -> None:
    user_id = seed(settings)
    db = Database.from_settings(settings)
    units = UsageQuantities(web_searches=3, code_seconds=4.5, images=2, audio_seconds=7.25)
    LedgerStore(db).insert(
        [
            make_record("f", user_id=user_id, model="m3", usage=units),
            make_record("g", user_id=user_id, model="m3", usage=UsageQuantities(video_seconds=5)),
        ]
    )
    db.dispose()
    code, out = run(capsys, settings, "--user", "alice", "--since", "2024-06-01")
    assert code == 0
    m3 = next(line.split() for line in out.splitlines() if line.startswith("m3"))
    assert dict(zip(HEADER, m3, strict=False)) | {"COST": m3[-2]} == {
        "MODEL": "m3",
        "REQUESTS": "2",
        "PROMPT": "0",
        "COMPLETION": "0",
        "CACHED": "0",
        "REASONING": "0",
        "SEARCHES": "3",
        "CODE_S": "4.50",
        "IMAGES": "2",
        "AUDIO_S": "7.25",
        "VIDEO_S": "5.00",
        "COST": "0.000000",
    }


def test_all_time_includes_older_records_and_user_ids_work(
    capsys: pytest.CaptureFixture[str], settings: GatewaySettings
) -> None:
    user_id = seed(settings)
    code, out = run(capsys, settings, "--user", user_id)
    assert code == 0
    total = out.strip().splitlines()[-1].split()
    assert total[:4] == ["TOTAL", "5", "1157", "557"]


def test_no_usage_unknown_users_and_bad_dates(
    capsys: pytest.CaptureFixture[str], settings: GatewaySettings
) -> None:
    seed(settings)
    code, out = run(capsys, settings, "--user", "alice", "--since", "2099-01-01")
    assert (code, out.strip()) == (0, "No usage recorded for user 'alice' since 2099-01-01 (UTC).")
    assert main(["usage", "--user", "nobody"], settings=settings) == 1
    assert "no user named 'nobody'" in capsys.readouterr().err
    assert main(["usage", "--user", "x", "--since", "05/01/2024"], settings=settings) == 2
    assert main(["usage", "--help"], settings=settings) == 0
    assert "--since DATE" in capsys.readouterr().out


def test_batch_lines_have_rows_of_their_own(
    capsys: pytest.CaptureFixture[str], settings: GatewaySettings
) -> None:
    user_id = seed(settings)
    db = Database.from_settings(settings)
    LedgerStore(db).insert(
        [
            make_record(
                "batch_req_1",
                user_id=user_id,
                usage=UsageQuantities(1_000_000, 0),
                batch_id="batch_1",
                batch_discount=0.5,
            )
        ]
    )
    db.dispose()
    code, out = run(capsys, settings, "--user", "alice", "--since", "2024-06-01")
    assert code == 0
    rows = {
        line.split()[0] + (" (batch)" if "(batch)" in line else ""): line
        for line in out.splitlines()
    }
    batch_row = rows["m1 (batch)"].split()
    # 1M prompt tokens at 1.0 per Mtok, half price; the live m1 row is unchanged.
    assert batch_row[2:4] == ["1", "1000000"] and batch_row[-2:] == ["0.500000", "eur"]
    assert rows["m1"].split()[1:3] == ["3", "150"]
