"""The run's report: JSON (everything), markdown (the tables) and the sweep chart (PNG, chart.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from tgi_llm.bench.results import ENGINE, BenchResults, Comparison, SystemRun
from tgi_llm.bench.server_metrics import acceptance
from tgi_llm.bench.stats import Distribution
from tgi_llm.bench.steps import forward_totals


def write_report(results: BenchResults, out_dir: Path, stem: str = "bench") -> dict[str, Path]:
    from tgi_llm.bench.chart import sweep_chart

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / f"{stem}.json", "markdown": out_dir / f"{stem}.md", "png": out_dir / f"{stem}.png"}
    paths["json"].write_text(json.dumps(results.to_dict(), indent=2, default=_json_default) + "\n")
    if results.meta.get("compare_off"):
        del paths["png"]
        paths["markdown"].write_text(render_modes_markdown(results))
        return paths
    sweep_chart(results, paths["png"])
    paths["markdown"].write_text(render_markdown(results, paths["png"].name))
    return paths


def _json_default(value: object) -> object:
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def _ms(d: Distribution, scale: float = 1e3, digits: int = 1) -> str:
    if d.count == 0:
        return "-"
    return " / ".join(f"{v * scale:.{digits}f}" for v in (d.p50, d.p90, d.p99))


def _num(value: float | None, fmt: str = ".1f") -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, fmt)


def _runs_table(runs: list[SystemRun]) -> list[str]:
    lines = [
        "| system | concurrency | rate req/s | ok / all | wall s | output tok/s | req/s "
        "| TTFT p50 / p90 / p99 ms | ITL p50 / p90 / p99 ms | TPOT p50 ms | e2e p50 / p90 / p99 s "
        "| guesses accepted |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        s = run.summary
        conc = f"batch {run.batch_size}" if run.batch_size else _num(s.concurrency, "d")
        lines.append(
            f"| {s.system} | {conc} | {_num(s.request_rate, '.2f')} | {s.completed} / {s.num_requests} "
            f"| {s.wall_s:.1f} | {_num(s.output_tokens_per_s)} | {_num(s.requests_per_s, '.2f')} | {_ms(s.ttft_s)} "
            f"| {_ms(s.itl_s)} | {_num(s.tpot_s.p50 * 1e3 if s.tpot_s.count else None)} | {_ms(s.e2e_s, 1, 2)} "
            f"| {_accepted(run)} |"
        )
    return lines


def _accepted(run: SystemRun) -> str:
    """Speculation's acceptance rate in the run, with how many guessed tokens it is over."""
    rate = acceptance(run.server_counters)
    return "-" if rate is None else f"{rate[1]:.0%} of {rate[0]:,.0f}"


def _comparisons_table(comparisons: list[Comparison]) -> list[str]:
    lines = ["| figure | value | goal | met | numerator | denominator |", "|---|---|---|---|---|---|"]
    for c in comparisons:
        value = "-" if c.value is None else (f"{c.value:.2f}x" if c.unit == "x" else f"{c.value:+.1f} ms")
        met = {True: "yes", False: "**no**", None: "-"}[c.met]
        note = f" ({c.note})" if c.note else ""
        lines.append(f"| {c.name} | {value}{note} | {c.goal or '-'} | {met} | {c.numerator} | {c.denominator} |")
    return lines


def _steps_table(results: BenchResults) -> list[str]:
    run = results.find(ENGINE, results.main_concurrency, results.meta.get("request_rate"))
    if run is None or not run.engine_steps:
        return ["No in-process engine run at the main concurrency."]
    lines = ["| method | batch | steps | forward p50 ms | bookkeeping p50 ms | bookkeeping share "
             "| matmul floor p50 ms | step p50 / floor |", "|---|---|---|---|---|---|---|---|"]
    for g in run.engine_steps:
        floor = results.floor_at(g.batch_size) if g.method == "decode" else None
        ratio = f"{g.step_p50_s / floor.median_s:.2f}x" if floor else "-"
        lines.append(f"| {g.method} | {g.batch_size} | {g.steps} | {g.forward_p50_s * 1e3:.2f} "
                     f"| {g.bookkeeping_p50_s * 1e3:.3f} | {g.bookkeeping_share:.1%} "
                     f"| {_num(floor.median_s * 1e3 if floor else None, '.2f')} | {ratio} |")
    return lines


def _forward_table(runs: list[SystemRun]) -> list[str]:
    rows = []
    for r in runs:
        totals = r.server_steps or (forward_totals(r.engine_steps) if r.engine_steps else None)
        rows += [(r.summary, m, v) for m, v in sorted((totals or {}).items())]
    if not rows:
        return []
    lines = ["", "Forward passes during each run: the server's engine from its `tgi_batch_forward_duration` "
             "metric, the in-process engine from its step stats (same model, same limits):", "",
             "| run | method | steps | forward mean ms |", "|---|---|---|---|"]
    for s, method, v in rows:
        lines.append(f"| {s.system} c={s.concurrency} | {method} | {v['steps']:.0f} "
                     f"| {v['forward_mean_s'] * 1e3:.2f} |")
    return lines


def _floor_lines(results: BenchResults) -> list[str]:
    if results.floor_error:
        return ["", f"Matmul floor: unavailable ({results.floor_error})."]
    if not results.floor:
        return []
    parts = []
    for p in results.floor:
        phases = ", ".join(f"{k} {v * 1e3:.2f}" for k, v in p.median_by_phase_s.items() if k)
        parts.append(f"batch {p.batch_size}: {p.median_s * 1e3:.2f} ms" + (f" ({phases})" if phases else "")
                     + f", {p.gflops_per_s:.0f} GFLOP/s, {p.weight_gb_per_s:.1f} GB/s of weights")
    return ["", "Matmul floor (tgi_llm/bench/floor.py, sampled before and after the engine run above): "
            + "; ".join(parts) + "."]


def _checks(runs: list[SystemRun]) -> list[str]:
    out = []
    for r in runs:
        s = r.summary
        if s.failed:
            out.append(f"- {s.system} c={s.concurrency}: {s.failed} failed: {'; '.join(s.errors)}")
        if s.token_count_mismatches:
            out.append(f"- {s.system} c={s.concurrency}: {s.token_count_mismatches} requests streamed a different "
                       "number of tokens than the server reported")
        if s.length_mismatches:
            out.append(f"- {s.system} c={s.concurrency}: {s.length_mismatches} requests did not generate their "
                       "asked output length")
    return out or ["- every request completed, streamed the token count the server reported, and generated "
                   "exactly its asked output length"]


def render_markdown(results: BenchResults, chart_name: str) -> str:
    m, w = results.meta, results.workload
    lines = [
        "# tgi_llm serving benchmark", "",
        f"- date: {m.get('date')}; revision: {m.get('revision')}; machine: {m.get('machine')}",
        f"- load average (1 min) before / after: {m.get('load_before')} / {m.get('load_after')}",
        f"- model: `{m.get('model')}`; server: {m.get('server')}",
        f"- workload: {w['kind']}, {w['num_requests']} requests, input tokens {w['input_len']} "
        f"(mean {w['input_mean']:.0f}), output tokens {w['output_len']} (mean {w['output_mean']:.0f}), "
        f"seed {w['seed']}, ignore_eos {w['ignore_eos']}"
        + (f"; sweep points other than the main run use the first {m['sweep_num_requests']}"
           if m.get("sweep_num_requests") else ""),
        f"- command: `{m.get('command')}`",
        "",
        "## Runs", "", *_runs_table(results.runs), "",
        "Static batches and one-at-a-time get every request at t=0 (offline), so their TTFT includes waiting "
        "for earlier batches; ITL is the gap between consecutive tokens pooled over requests; TPOT is per request.",
        "",
        "## Against the targets", "", *_comparisons_table(results.comparisons), "",
        f"## Steps of the engine in-process at concurrency {results.main_concurrency}", "",
        *_steps_table(results),
        *_floor_lines(results),
        *_forward_table(results.runs), "",
        "## Checks", "", *_checks(results.runs), "",
        "## Concurrency sweep", "", f"![throughput and TTFT against concurrency]({chart_name})", "",
    ]
    return "\n".join(lines)


def render_modes_markdown(results: BenchResults) -> str:
    """A --compare-off run: the same workload with the engine feature on and off."""
    from tgi_llm.bench.modes import turn_ttfts

    m, w = results.meta, results.workload
    if w["kind"] == "multi-turn":
        shape = (f"multi-turn chat: {w['conversations']} conversations x {w['turns']} turns, a shared system prompt "
                 f"of ~{w['system_tokens']} tokens, questions of ~{w['question_tokens']} tokens, "
                 f"{w['answer_tokens']} tokens generated per turn; each turn's prompt is the whole history")
    else:
        shape = (f"{w['kind']}, {w['num_requests']} requests, input tokens {w['input_len']} "
                 f"(mean {w['input_mean']:.0f}), output tokens {w['output_len']} (mean {w['output_mean']:.0f})")
    lines = [
        f"# tgi_llm benchmark: {m['compare_off']} on / off", "",
        f"- date: {m.get('date')}; revision: {m.get('revision')}; machine: {m.get('machine')}",
        f"- load average (1 min) before / after: {m.get('load_before')} / {m.get('load_after')}",
        f"- model: `{m.get('model')}`; limits: {m.get('limits') or 'defaults'}",
        f"- workload: {shape}; concurrency {results.main_concurrency}; seed {w['seed']}",
        f"- command: `{m.get('command')}`", "",
        "## Runs", "", *_runs_table(results.runs), "",
    ]
    turns = w.get("turns")
    if turns:
        lines += ["## TTFT by turn (ms, p50 / p90 / p99)", "",
                  "| run | " + " | ".join(f"turn {t + 1}" for t in range(turns)) + " |",
                  "|---|" + "---|" * turns]
        for run in results.runs:
            cells = [_ms(turn_ttfts(run, turns, t, t), digits=0) for t in range(turns)]
            lines.append(f"| {run.summary.system} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += ["## Against the targets", "", *_comparisons_table(results.comparisons), "",
              *_forward_table(results.runs), "", "## Checks", "", *_checks(results.runs), ""]
    return "\n".join(lines)
