"""The sweep chart: output tokens/s and TTFT p50 against concurrency, for the server and the engine
in-process, with the transformers baselines as horizontal lines (they have no concurrency)."""

from __future__ import annotations

from pathlib import Path

from tgi_llm.bench.results import ENGINE, SERIAL, STATIC, BenchResults

_STYLE = {ENGINE: dict(marker="s", linestyle="--")}


def sweep_chart(results: BenchResults, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    fig, (tput, ttft) = plt.subplots(1, 2, figsize=(11, 4.2))
    swept = sorted({r.summary.system for r in results.runs if r.summary.concurrency is not None
                    and r.summary.request_rate is None})
    for system in swept:
        points = sorted((r.summary.concurrency, r.summary) for r in results.runs
                        if r.summary.system == system and r.summary.request_rate is None
                        and r.summary.concurrency is not None and r.summary.completed)
        xs = [c for c, _ in points]
        style = _STYLE.get(system, dict(marker="o", linestyle="-"))
        tput.plot(xs, [s.output_tokens_per_s for _, s in points], label=system, **style)
        ttft.plot(xs, [s.ttft_s.p50 * 1e3 for _, s in points], label=f"{system} p50", **style)
    for system, color in ((STATIC, "tab:red"), (SERIAL, "tab:gray")):
        run = results.find(system)
        if run is not None and run.summary.completed:
            label = f"transformers static batch {run.batch_size}" if system == STATIC else "transformers one at a time"
            tput.axhline(run.summary.output_tokens_per_s, color=color, linestyle=":", label=label)
    ticks = sorted({r.summary.concurrency for r in results.runs if r.summary.concurrency})
    for ax in (tput, ttft):
        ax.set_xscale("log", base=2)
        if ticks:
            ax.set_xticks(ticks, [str(t) for t in ticks])
            ax.minorticks_off()
        ax.set_xlabel("concurrency (requests in flight)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    tput.set_ylabel("output tokens/s")
    tput.set_ylim(bottom=0)
    ttft.set_ylabel("time to first token, p50 (ms)")
    ttft.set_ylim(bottom=0)
    w, name = results.workload, Path(str(results.meta.get("model_name", ""))).name
    sweep_n = results.meta.get("sweep_num_requests")
    sizes = f"{w['num_requests']} requests" + (f" ({sweep_n} per sweep point)" if sweep_n else "")
    fig.suptitle(f"{name}: {w['kind']} workload, {sizes}, {results.meta.get('date', '')}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
