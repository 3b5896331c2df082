"""Printing and plotting the figures of ``bench/vs_vllm.py`` (kept apart from the measuring)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

SHORT_KIND = {"non-streamed": "json", "streamed": "stream", "ttft": "TTFT"}


def comparisons(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every gateway stack measured against the bare server: the main one, then variants."""
    main = {"latency": result["latency"], "tokens_per_s": result["tokens_per_s"]}
    return {"gateway": main, **{f"gateway[{k}]": v for k, v in result["variants"].items()}}


def report(result: dict[str, Any]) -> None:
    cfg = result["config"]
    print(
        f"\n{cfg['model']} ({cfg['engine']}); {cfg['requests']} calls per path in turns, "
        f"{cfg['tokens']} tokens forced, temperature 0; {result['host']['cpus']} cores"
    )
    for name, spec in cfg.get("variants", {}).items():
        print(f"variant {name}: {spec}")
    for name, figures in comparisons(result).items():
        print(f"\n{name} against the bare server")
        print(f"{'':<14}{'':>5}{'bare ms':>10}{'gateway ms':>12}{'added ms':>10}{'ratio':>8}")
        for kind, row in figures["latency"].items():
            for p in row["bare_ms"]:
                print(
                    f"{kind:<14}{p:>5}{row['bare_ms'][p]:>10.1f}{row['gateway_ms'][p]:>12.1f}"
                    f"{row['added_ms'][p]:>+10.1f}{row['ratio'][p] or 0:>8.3f}"
                )
        print("completion tokens/s (2 x N streams per round, N in flight):")
        for c, row in figures["tokens_per_s"].items():
            print(
                f"  {c:>3} streams: bare {_list(row['bare'])}  gateway {_list(row['gateway'])}  "
                f"ratio {row['ratio']:.3f}"
            )
    print("\nCPU seconds per 1,000 generated tokens:")
    for phase, stacks in result["cpu_s_per_1k_tokens"].items():
        for name, roles in stacks.items():
            parts = ", ".join(f"{r} {v:.2f}" for r, v in roles.items() if r != "total")
            print(f"  {phase:<12}{name:<18} total {roles.get('total', 0):6.2f}: {parts}")
    idle_cpu = result["idle_cpu"]
    if idle_cpu:
        print(f"\nidle, {idle_cpu['seconds']} s with nothing to do (share of one core):")
        for name, stack in idle_cpu.items():
            if name == "seconds":
                continue
            roles = ", ".join(f"{r} {v:.3f}" for r, v in stack["by_role"].items())
            print(f"  {name:<18} {stack['total_core_share']:.3f}: {roles}")
        for row in idle_cpu["gateway"]["by_process"][:8]:
            print(f"    {row['core_share']:.3f}  {row['process']}")
    short = result["short_answers"]
    if any(short.values()):
        print(f"\nWARNING: answers shorter than --tokens: {short}")


def _list(values: list[float]) -> str:
    return "/".join(f"{v:.1f}" for v in values)


def plot(result: dict[str, Any], target: Path) -> bool:
    """Latency percentiles and tokens/s, bare vs each gateway; False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    stacks = comparisons(result)
    fig, (ax_lat, ax_tps) = plt.subplots(1, 2, figsize=(13, 4.8))
    first = next(iter(stacks.values()))
    labels = [
        f"{SHORT_KIND[kind]}\n{p}" for kind, row in first["latency"].items() for p in row["bare_ms"]
    ]
    series = {
        "vLLM server": [v for row in first["latency"].values() for v in row["bare_ms"].values()]
    }
    for name, figures in stacks.items():
        series[name] = [
            v for row in figures["latency"].values() for v in row["gateway_ms"].values()
        ]
    width = 0.8 / len(series)
    for i, (name, values) in enumerate(series.items()):
        offset = (i - (len(series) - 1) / 2) * width
        ax_lat.bar([x + offset for x in range(len(labels))], values, width, label=name)
    ax_lat.set_xticks(list(range(len(labels))), labels, fontsize=7)
    ax_lat.set_ylabel("ms")
    ax_lat.set_title(f"latency, {result['config']['tokens']} tokens, one call at a time")
    ax_lat.legend(fontsize=7)
    conc = list(first["tokens_per_s"])
    lines = {"vLLM server": [first["tokens_per_s"][c]["bare"] for c in conc]}
    for name, figures in stacks.items():
        lines[name] = [figures["tokens_per_s"][c]["gateway"] for c in conc]
    for name, rounds in lines.items():
        mean = [sum(r) / len(r) for r in rounds]
        err = [[m - min(r) for m, r in zip(mean, rounds, strict=True)]]
        err.append([max(r) - m for m, r in zip(mean, rounds, strict=True)])
        ax_tps.errorbar([int(c) for c in conc], mean, yerr=err, marker="o", capsize=4, label=name)
    ax_tps.set_xticks([int(c) for c in conc])
    ax_tps.set_ylim(bottom=0)
    ax_tps.set_xlabel("concurrent streams")
    ax_tps.set_ylabel("completion tokens/s (min-mean-max of rounds)")
    ax_tps.set_title("throughput")
    ax_tps.legend(fontsize=7)
    fig.suptitle(f"gateway vs vLLM's OpenAI server - {result['started']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(target, dpi=110)
    plt.close(fig)
    return True
