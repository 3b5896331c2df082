"""What ``enable_lora`` costs in host memory: SmolLM2's engine with and without ``lora``.

Starts vLLM (``vllm.LLM``: the driver, its EngineCore and CPU worker processes) on the
prepared SmolLM2 folder with the catalog's engine settings (configs/catalog/local.yaml,
the ``smollm2-135m-instruct`` entry, through ``VLLMEngineConfig.engine_kwargs`` as the
head does), once without its ``lora`` block and once with it, each in a fresh child
process. The parent samples the RSS and PSS of the child's whole process tree every
``--period-s`` and prints, per variant, the peak until the engine was loaded, after one
base generation and (with ``lora``) after one generation with the packaged adapter
(docs/reference/adapters.md#memory):

    flock /tmp/heavy.lock .venv/bin/python bench/lora_memory.py

PSS counts pages shared between the tree's processes once (what the tree costs the
machine); RSS counts them in every process that maps them.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import psutil  # noqa: E402

from bench.memory_budget import pss_bytes  # noqa: E402
from bench.servers import descendants  # noqa: E402

CATALOG = REPO / "configs" / "catalog" / "local.yaml"
MODEL_ID = "smollm2-135m-instruct"
ADAPTER = "prepared:smollm2-json-lora"
PROMPT = "What is the capital of Portugal?"
MiB = 1024**2
PHASES = ("loaded", "base generation", "adapter generation")


def catalog_engine_config(with_lora: bool, catalog: Path = CATALOG) -> dict[str, Any]:
    """The catalog entry's ``engine.config``, without its ``lora`` block unless asked."""
    import yaml

    entries = yaml.safe_load(catalog.read_text())["models"]
    config = dict(next(e for e in entries if e["id"] == MODEL_ID)["engine"]["config"])
    if not with_lora:
        config.pop("lora", None)
    return config


def _child(with_lora: bool) -> None:
    """Start the engine, generate, and tell the parent each phase on stdout."""
    from vllm import LLM, SamplingParams
    from vllm.lora.request import LoRARequest

    from deployments.chat.vllm_config import VLLMEngineConfig
    from deployments.local_models.resolve import resolve_model

    config = VLLMEngineConfig(**catalog_engine_config(with_lora))
    llm = LLM(**config.engine_kwargs("cpu", resolve_model(config.model)))
    _phase("loaded")
    params = SamplingParams(max_tokens=20, temperature=0)
    messages: list[Any] = [{"role": "user", "content": PROMPT}]
    out = llm.chat(messages, params)
    print("base:", json.dumps(out[0].outputs[0].text), file=sys.stderr)
    _phase("base generation")
    if with_lora:
        adapter = LoRARequest("json", 1, resolve_model(ADAPTER))
        out = llm.chat(messages, params, lora_request=adapter)
        print("adapter:", json.dumps(out[0].outputs[0].text), file=sys.stderr)
        _phase("adapter generation")


def _phase(name: str) -> None:
    print(f"PHASE {name}", flush=True)
    time.sleep(3)  # a few samples of the settled tree


@dataclass
class TreeSampler:
    """Peak RSS and PSS of a process tree, kept per phase the child announces."""

    root_pid: int
    period_s: float
    phase: str = "starting"
    peaks: dict[str, tuple[int, int]] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        """Sample until ``stop`` is set."""
        while not self.stop.is_set():
            rss = pss = 0
            for process in descendants(self.root_pid):
                try:
                    rss += process.memory_info().rss
                except psutil.Error:  # gone between listing and reading
                    continue
                pss += pss_bytes(process.pid)
            old_rss, old_pss = self.peaks.get(self.phase, (0, 0))
            self.peaks[self.phase] = (max(old_rss, rss), max(old_pss, pss))
            self.stop.wait(self.period_s)


def cumulative_peaks(peaks: dict[str, tuple[int, int]]) -> dict[str, tuple[int, int]]:
    """Peak (RSS, PSS) up to and including each phase the child reached, in phase order.

    A phase's samples are those taken after the child announced it; the phase before it
    (``starting`` for ``loaded``) holds what led up to it, so a phase's figure is the peak
    of everything sampled before its successor began.
    """
    order = ["starting", *PHASES]
    reached = [name for name in order if name in peaks]
    result: dict[str, tuple[int, int]] = {}
    rss = pss = 0
    for name in reached:
        rss, pss = max(rss, peaks[name][0]), max(pss, peaks[name][1])
        if name != "starting":
            result[name] = (rss, pss)
    return result


def measure(with_lora: bool, period_s: float) -> dict[str, tuple[int, int]]:
    """Run one variant in a child process and return its cumulative peaks per phase."""
    args = [sys.executable, __file__, "--child", "lora" if with_lora else "base"]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True, cwd=REPO)
    sampler = TreeSampler(proc.pid, period_s)
    thread = threading.Thread(target=sampler.run, daemon=True)
    thread.start()
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("PHASE "):
            sampler.phase = line.removeprefix("PHASE ").strip()
    proc.wait()
    sampler.stop.set()
    thread.join()
    if proc.returncode != 0:
        raise SystemExit(f"the {'lora' if with_lora else 'base'} child failed: {proc.returncode}")
    return cumulative_peaks(sampler.peaks)


def main() -> None:
    """Both variants one after the other, then a table (MiB) and JSON on stdout."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--child", choices=("base", "lora"), help=argparse.SUPPRESS)
    parser.add_argument("--period-s", type=float, default=0.2)
    args = parser.parse_args()
    if args.child:
        _child(args.child == "lora")
        return
    results = {name: measure(name == "lora", args.period_s) for name in ("base", "lora")}
    print("| phase | RSS without lora | RSS with lora | PSS without lora | PSS with lora |")
    print("|---|---|---|---|---|")
    for phase in PHASES:
        base, lora = results["base"].get(phase), results["lora"].get(phase)
        if lora is None:
            continue
        cells = [f"{v / MiB:.0f}" if v else "-" for v in _cells(base, lora)]
        print(f"| {phase} | " + " | ".join(cells) + " |")
    print(json.dumps({k: {p: list(v) for p, v in r.items()} for k, r in results.items()}))


def _cells(base: tuple[int, int] | None, lora: tuple[int, int]) -> list[int]:
    return [base[0] if base else 0, lora[0], base[1] if base else 0, lora[1]]


if __name__ == "__main__":
    main()
