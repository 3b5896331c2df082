"""bench/lora_memory.py's bookkeeping: the catalog's engine settings, peaks per phase."""

from __future__ import annotations

from bench.lora_memory import catalog_engine_config, cumulative_peaks


def test_the_variants_differ_only_by_the_lora_block() -> None:
    with_lora, without = catalog_engine_config(True), catalog_engine_config(False)
    assert with_lora["lora"]["max_lora_rank"] == 8 and with_lora["lora"]["max_loras"] == 2
    assert "lora" not in without
    assert {k: v for k, v in with_lora.items() if k != "lora"} == without
    assert without["model"] == "prepared:smollm2-135m-instruct"


def test_a_phase_peak_covers_everything_before_the_next_phase() -> None:
    peaks = {
        "starting": (900, 700),  # the engine loading: the highest RSS before "loaded"
        "loaded": (800, 600),
        "base generation": (850, 650),
        "adapter generation": (840, 660),
    }
    assert cumulative_peaks(peaks) == {
        "loaded": (900, 700),
        "base generation": (900, 700),
        "adapter generation": (900, 700),
    }
    assert cumulative_peaks({"starting": (10, 5), "loaded": (20, 6)}) == {"loaded": (20, 6)}
    assert cumulative_peaks({"starting": (10, 5)}) == {}
