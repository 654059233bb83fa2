"""`tgi-llm-bench`: the serving benchmark. Every comparison it reports is a ratio of two numbers it measured
in the same invocation, on the same requests.

    tgi-llm-bench --launch --workload mixed --num-requests 64 --concurrency 32 --sweep 1 4 16 32

What runs, in order: a short warm-up; the server (launched on free 127.0.0.1 ports with --launch, else
attached with --grpc-url / --http-url) and the engine in-process (tgi_llm.LLM, the same limits) at each
concurrency of the sweep, back to back, the matmul floor sampled right before and after the engine's main
run; then the server is stopped and transformers runs the same requests in static batches and one at a
time. Writes <out-dir>/bench.{json,md,png} (and launcher.log with --launch).
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import signal
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tgi_llm.bench.driver import LoadSpec, run_load
from tgi_llm.bench.results import ENGINE, SERIAL, STATIC, TRITON_GRPC, TRITON_HTTP, BenchResults, SystemRun
from tgi_llm.bench.stats import summarize
from tgi_llm.bench.workload import BenchRequest, WorkloadSpec, build_workload

#: Limits given to the launched server and to the in-process engine alike (flag name = LimitOptions field).
LIMIT_FLAGS = ("max_input_tokens", "max_total_tokens", "max_batch_prefill_tokens", "max_batch_total_tokens",
               "max_batch_size", "max_concurrent_requests")
SKIPPABLE = ("engine", "static", "serial", "floor")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="tgi-llm-bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    target = ap.add_mutually_exclusive_group(required=True)
    target.add_argument("--launch", action="store_true",
                        help="start tgi-llm-launcher on free ports; stop it at the end")
    target.add_argument("--grpc-url", help="a running server's Triton gRPC host:port")
    target.add_argument("--http-url", help="a running server's Triton HTTP base URL (generate_stream)")
    ap.add_argument("--protocol", choices=("grpc", "http"), default="grpc", help="with --launch: which endpoint")
    ap.add_argument("--metrics-url", help="the server's Prometheus URL, for its forward times (auto with --launch)")
    ap.add_argument("--model-id", default=None, help="the server's model (tokenizer, baselines); default SmolLM2-135M")
    ap.add_argument("--dtype", default=None, choices=("float32", "bfloat16", "float16"))
    ap.add_argument("--kv-cache-memory-gb", type=float, default=None)
    for name in LIMIT_FLAGS:
        ap.add_argument("--" + name.replace("_", "-"), type=int, default=None,
                        help="given to the launched server and the in-process engine")
    ap.add_argument("--launch-timeout-s", type=float, default=900.0)

    w = ap.add_argument_group("workload")
    w.add_argument("--workload", choices=("fixed", "mixed", "multi-turn"), default="mixed",
                   help="multi-turn (chat conversations sharing a system prompt) needs --compare-off")
    w.add_argument("--num-requests", type=int, default=64)
    w.add_argument("--input-len", type=int, default=256, help="fixed workload")
    w.add_argument("--output-len", type=int, default=128, help="fixed workload")
    w.add_argument("--input-range", type=int, nargs=2, default=(64, 512), metavar=("MIN", "MAX"), help="mixed")
    w.add_argument("--output-range", type=int, nargs=2, default=(32, 256), metavar=("MIN", "MAX"), help="mixed")
    w.add_argument("--seed", type=int, default=0)
    w.add_argument("--conversations", type=int, default=16, help="multi-turn: conversations")
    w.add_argument("--turns", type=int, default=5, help="multi-turn: turns per conversation")
    w.add_argument("--system-tokens", type=int, default=500, help="multi-turn: the shared system prompt")
    w.add_argument("--question-tokens", type=int, default=40, help="multi-turn: each user message")
    w.add_argument("--answer-tokens", type=int, default=64, help="multi-turn: tokens generated per turn")
    w.add_argument("--no-ignore-eos", dest="ignore_eos", action="store_false",
                   help="let requests stop at EOS (output lengths then differ between systems)")

    load = ap.add_argument_group("load")
    load.add_argument("--concurrency", type=int, default=32, help="requests in flight (the main run)")
    load.add_argument("--request-rate", type=float, default=None,
                      help="Poisson arrivals per second for the main run (capped at --concurrency)")
    load.add_argument("--sweep", type=int, nargs="*", default=[1, 4, 16, 32], help="concurrencies to sweep")
    load.add_argument("--sweep-num-requests", type=int, default=None, help="requests per sweep point (default all)")
    load.add_argument("--timeout-s", type=float, default=1800.0, help="bound on each run's wall time")
    load.add_argument("--warmup-requests", type=int, default=2)

    base = ap.add_argument_group("baselines")
    base.add_argument("--static-batch-size", type=int, default=16)
    base.add_argument("--serial-num-requests", type=int, default=None,
                      help="requests for one-at-a-time (default all; it is the slowest)")
    base.add_argument("--skip", nargs="*", choices=SKIPPABLE, default=[], help="baselines to leave out")
    base.add_argument("--floor-reps", type=int, default=20)

    ap.add_argument("--compare-off", choices=("prefix-caching", "prefill-chunking"), default=None,
                    help="run the workload on two launched servers, the feature on and off, and compare "
                         "(needs --launch; no sweep, in-process engine or transformers baselines)")
    ap.add_argument("--out-dir", type=Path, default=Path.home() / ".cache" / "tgi_llm" / "bench",
                    help="raw results (outside the checkout by default)")
    ap.add_argument("--no-progress", dest="progress", action="store_false")
    return ap.parse_args(argv)


@dataclass
class Target:
    """The server under test: how to reach it, and the launched process when we started it."""

    system: str
    url: str
    metrics_url: str | None
    launched: Any = None

    def client(self, ignore_eos: bool, max_in_flight: int) -> Any:
        from tgi_llm.bench.clients import GrpcStreamClient, HttpStreamClient

        if self.system == TRITON_HTTP:
            return HttpStreamClient(self.url, max_in_flight, ignore_eos)
        return GrpcStreamClient(self.url, ignore_eos)


def _limit_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    out = {name: getattr(args, name) for name in (*LIMIT_FLAGS, "dtype", "kv_cache_memory_gb")}
    return {k: v for k, v in out.items() if v is not None}


def _launcher_flags(args: argparse.Namespace, model_dir: Path) -> list[str]:
    flags = ["--model-id", str(model_dir)]
    for name, value in _limit_kwargs(args).items():
        flags += ["--" + name.replace("_", "-"), str(value)]
    return flags


def _machine() -> str:
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    gpu = f", GPU {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else ", no GPU"
    return (f"{cpu}, {os.cpu_count()} CPUs, torch {torch.__version__} ({torch.get_num_threads()} threads){gpu}, "
            f"Python {platform.python_version()}, {platform.system()} {platform.release()}")


def _revision() -> str:
    """The checkout's commit, marked dirty when the working tree differs (what was measured)."""
    import subprocess

    root = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True,
                              timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (head + ("-dirty" if dirty else "")) if head else "unknown"


def _load() -> float:
    return round(os.getloadavg()[0], 2)


class Bench:
    def __init__(self, args: argparse.Namespace, requests: list[BenchRequest], results: BenchResults,
                 target: Target) -> None:
        self.args, self.requests, self.results, self.target = args, requests, results, target
        self.max_in_flight = max([args.concurrency, *args.sweep])
        self._client: Any = None
        self.floor: Any = None  # FloorMeter, sampled around the main engine run
        self.main_load: LoadSpec | None = None

    def server_client(self) -> Any:
        """One client for every run (its streams or connections stay open between runs, as a real
        client's do); a run that timed out closed it, and the next run gets a new one."""
        if self._client is None:
            self._client = self.target.client(self.args.ignore_eos, self.max_in_flight)
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def run_pair(self, llm: Any, load: LoadSpec, requests: list[BenchRequest], flip: bool) -> None:
        """The server and the engine in-process on the same requests and load, back to back (order
        alternating over the sweep so a slow drift of the machine does not always favour one)."""
        order = ["server", "engine"] if not flip else ["engine", "server"]
        for which in order:
            if which == "server":
                self.results.runs.append(self.run_server(load, requests))
                _save_partial(self.results, self.args.out_dir)
            elif llm is not None:
                bracket = self.floor is not None and load == self.main_load
                if bracket:
                    self.floor.sample(self.args.floor_reps // 2, "before")
                self.results.runs.append(self.run_engine(llm, load, requests))
                _save_partial(self.results, self.args.out_dir)
                if bracket:
                    self.floor.sample(self.args.floor_reps - self.args.floor_reps // 2, "after")

    def run_server(self, load: LoadSpec, requests: list[BenchRequest]) -> SystemRun:
        from tgi_llm.bench.server_metrics import SPECULATION_COUNTERS, read_counters, read_forward_totals

        target = self.target
        before = read_forward_totals(target.metrics_url) if target.metrics_url else None
        counters_before = read_counters(target.metrics_url, SPECULATION_COUNTERS) if target.metrics_url else None
        records, wall = run_load(self.server_client(), requests, load, self.args.progress,
                                 f"{target.system} c={load.concurrency}")
        if any(r.error and r.error.startswith("not finished") for r in records):
            self._client = None  # closed by the driver
        if target.metrics_url:
            time.sleep(0.3)  # the server's responder publishes step timings every 100 ms
        after = read_forward_totals(target.metrics_url) if target.metrics_url else None
        counters_after = read_counters(target.metrics_url, SPECULATION_COUNTERS) if target.metrics_url else None
        steps = after.minus(before) if before and after else None
        gained = ({k: counters_after[k] - counters_before[k] for k in SPECULATION_COUNTERS}
                  if counters_before and counters_after else None)
        return SystemRun(summarize(target.system, records, wall, load.concurrency, load.request_rate),
                         server_steps=steps, ttft_by_request=_ttfts(records), server_counters=gained)

    def run_engine(self, llm: Any, load: LoadSpec, requests: list[BenchRequest]) -> SystemRun:
        from tgi_llm.bench.clients import EngineClient
        from tgi_llm.bench.server_metrics import speculation_counters
        from tgi_llm.bench.steps import StepCollector, group_steps

        llm.engine.drain_step_stats()
        before = speculation_counters(llm.engine.scheduler)
        with StepCollector(llm.engine.drain_step_stats) as collected:
            records, wall = run_load(EngineClient(llm, self.args.ignore_eos), requests, load, self.args.progress,
                                     f"engine c={load.concurrency}")
        after = speculation_counters(llm.engine.scheduler)
        return SystemRun(summarize(ENGINE, records, wall, load.concurrency, load.request_rate),
                         engine_steps=group_steps(collected.steps), ttft_by_request=_ttfts(records),
                         server_counters={k: after[k] - before[k] for k in after})

    def warm_up(self, llm: Any) -> None:
        """Short requests through each path, unmeasured, at the highest concurrency of the run: first calls
        pay for lazy initialisation, and every stream or connection the runs use is opened here."""
        n = max(self.args.warmup_requests, self.max_in_flight) if self.args.warmup_requests > 0 else 0
        if n <= 0:
            return
        base = self.requests[0]
        short = [BenchRequest(i, base.prompt[:200], base.input_ids, 2) for i in range(n)]
        load = LoadSpec(concurrency=n, timeout_s=self.args.timeout_s)
        run_load(self.server_client(), short, load, progress=False)
        if llm is not None:
            from tgi_llm.bench.clients import EngineClient

            run_load(EngineClient(llm, self.args.ignore_eos), short, load, progress=False)
            llm.engine.drain_step_stats()


def _ttfts(records: list[Any]) -> dict[int, float]:
    return {r.index: r.ttft for r in records if r.ok and r.ttft is not None}


def _save_partial(results: BenchResults, out_dir: Path) -> None:
    """Every finished run, at once: a long invocation that is stopped still leaves its numbers."""
    import json

    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "bench.partial.json").write_text(json.dumps(results.to_dict(), indent=2, default=str) + "\n")


def _workload_spec(args: argparse.Namespace) -> WorkloadSpec:
    if args.workload == "fixed":
        return WorkloadSpec.fixed(args.num_requests, args.input_len, args.output_len, args.seed)
    return WorkloadSpec("mixed", args.num_requests, tuple(args.input_range), tuple(args.output_range), args.seed)


def _server_points(args: argparse.Namespace) -> list[tuple[LoadSpec, bool]]:
    """(load, uses the whole request set) for the main run and each sweep point."""
    main = LoadSpec(args.concurrency, args.request_rate, args.seed, args.timeout_s)
    points = [(main, True)]
    for c in sorted(set(args.sweep)):
        if c != args.concurrency or args.request_rate is not None:
            points.append((LoadSpec(c, None, args.seed, args.timeout_s), False))
    return sorted(points, key=lambda p: (p[0].concurrency or 0, p[0].request_rate is not None))


def run(args: argparse.Namespace) -> BenchResults:
    from transformers import AutoTokenizer

    from tgi_llm.weights import resolve_model_dir

    model_dir = resolve_model_dir(args.model_id)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if args.compare_off or args.workload == "multi-turn":
        return _run_modes(args, model_dir, tokenizer)
    spec = _workload_spec(args)
    requests = build_workload(tokenizer, spec)
    ins, outs = [r.input_len for r in requests], [r.output_len for r in requests]
    workload = {"kind": spec.kind, "num_requests": spec.num_requests, "input_len": list(spec.input_len),
                "output_len": list(spec.output_len), "seed": spec.seed, "ignore_eos": args.ignore_eos,
                "input_mean": sum(ins) / len(ins), "output_mean": sum(outs) / len(outs),
                "input_tokens": sum(ins), "output_tokens": sum(outs)}
    meta = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "machine": _machine(),
            "load_before": _load(), "revision": _revision(), "model": str(model_dir),
            "model_name": args.model_id or model_dir.name,
            "command": shlex.join(["tgi-llm-bench", *sys.argv[1:]]) if args.command is None else args.command,
            "request_rate": args.request_rate, "limits": _limit_kwargs(args),
            "sweep_num_requests": args.sweep_num_requests if args.sweep_num_requests != args.num_requests else None}
    results = BenchResults(meta, workload, args.concurrency)
    target = _attach_or_launch(args, model_dir)
    meta["server"] = (f"launched, {target.system} at {target.url}, flags {' '.join(_launcher_flags(args, model_dir))}"
                      if target.launched else f"{target.system} at {target.url}")
    llm = None
    try:
        if "engine" not in args.skip or "floor" not in args.skip:
            from tgi_llm import LLM

            llm = LLM(str(model_dir), **_limit_kwargs(args))
        bench = Bench(args, requests, results, target)
        engine = llm if "engine" not in args.skip else None
        try:
            bench.warm_up(engine)
            if "floor" not in args.skip and llm is not None:
                bench.floor = _floor_meter(args, llm, results)  # after the warm-up: the engine's kernels exist
            points = _server_points(args)
            bench.main_load = points[[whole for _, whole in points].index(True)][0]
            sweep_n = args.sweep_num_requests or len(requests)
            for i, (load, whole) in enumerate(points):
                bench.run_pair(engine, load, requests if whole else requests[:sweep_n], flip=i % 2 == 1)
        finally:
            bench.close()
        if bench.floor is not None:
            if engine is None:  # nothing to bracket: sample it here
                bench.floor.sample(args.floor_reps, "after")
            results.floor = bench.floor.points()
    finally:
        if llm is not None:
            llm.close()
            llm = engine = None  # its model and KV cache are not kept through the transformers runs
        if target.launched is not None:
            target.launched.stop()
    _baselines(args, model_dir, tokenizer, requests, results)
    meta["load_after"] = _load()
    from tgi_llm.bench.targets import compare

    results.comparisons = compare(results, target.system, args.static_batch_size if "static" not in args.skip else None)
    return results


def _run_modes(args: argparse.Namespace, model_dir: Path, tokenizer: Any) -> BenchResults:
    from tgi_llm.bench.conversations import ConversationSpec, build_conversations, run_conversations
    from tgi_llm.bench.modes import compare_modes, run_modes

    if not (args.launch and args.compare_off):
        raise SystemExit("tgi-llm-bench: --compare-off needs --launch, and --workload multi-turn needs --compare-off")
    if args.workload == "multi-turn":
        spec = ConversationSpec(args.conversations, args.turns, args.system_tokens, args.question_tokens,
                                args.answer_tokens, args.seed)
        conversations = build_conversations(tokenizer, spec)
        workload = {"kind": "multi-turn", "num_requests": spec.num_requests, "conversations": spec.conversations,
                    "turns": spec.turns, "system_tokens": spec.system_tokens,
                    "question_tokens": spec.question_tokens, "answer_tokens": spec.answer_tokens, "seed": spec.seed,
                    "ignore_eos": args.ignore_eos}

        def run_workload(client: Any, desc: str) -> Any:
            return run_conversations(client, tokenizer, conversations, spec, args.concurrency, args.timeout_s,
                                     args.progress, desc)
    else:
        spec = _workload_spec(args)
        requests = build_workload(tokenizer, spec)
        ins, outs = [r.input_len for r in requests], [r.output_len for r in requests]
        workload = {"kind": spec.kind, "num_requests": spec.num_requests, "input_len": list(spec.input_len),
                    "output_len": list(spec.output_len), "seed": spec.seed, "ignore_eos": args.ignore_eos,
                    "input_mean": sum(ins) / len(ins), "output_mean": sum(outs) / len(outs)}
        load = LoadSpec(args.concurrency, args.request_rate, args.seed, args.timeout_s)

        def run_workload(client: Any, desc: str) -> Any:
            return run_load(client, requests, load, args.progress, desc)
    meta = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "machine": _machine(),
            "load_before": _load(), "revision": _revision(), "model": str(model_dir),
            "command": shlex.join(["tgi-llm-bench", *sys.argv[1:]]) if args.command is None else args.command,
            "compare_off": args.compare_off, "limits": _limit_kwargs(args), "request_rate": args.request_rate}
    results = BenchResults(meta, workload, args.concurrency)
    run_modes(args, _launcher_flags(args, model_dir), workload, results, run_workload)
    meta["load_after"] = _load()
    results.comparisons = compare_modes(results)
    return results


def _attach_or_launch(args: argparse.Namespace, model_dir: Path) -> Target:
    if args.grpc_url:
        return Target(TRITON_GRPC, args.grpc_url, args.metrics_url)
    if args.http_url:
        return Target(TRITON_HTTP, args.http_url, args.metrics_url)
    from tgi_llm.bench.server import launch

    print("launching the server ...", file=sys.stderr)
    server = launch(_launcher_flags(args, model_dir), args.out_dir / "launcher.log", args.launch_timeout_s)
    if args.protocol == "http":
        return Target(TRITON_HTTP, server.http_url, server.metrics_url, server)
    return Target(TRITON_GRPC, server.grpc_url, server.metrics_url, server)


def _floor_meter(args: argparse.Namespace, llm: Any, results: BenchResults) -> Any:
    from tgi_llm.bench.floor import FloorMeter

    model = getattr(llm.engine.runner, "model", None)
    if model is None:
        results.floor_error = "the engine's runner exposes no model (sharded?)"
        return None
    try:
        return FloorMeter(model, sorted({*args.sweep, args.concurrency}))
    except Exception as exc:  # the floor is a report line, not a reason to lose the run
        results.floor_error = f"{type(exc).__name__}: {exc}"
        return None


def _baselines(args: argparse.Namespace, model_dir: Path, tokenizer: Any, requests: list[BenchRequest],
               results: BenchResults) -> None:
    if "static" in args.skip and "serial" in args.skip:
        return
    from tgi_llm.bench.baselines import load_hf_model, run_static_batches, warm_up
    from tgi_llm.engine.builder import resolve_device_and_dtype
    from tgi_llm.engine.options import EngineOptions

    device, dtype = resolve_device_and_dtype(EngineOptions(dtype=args.dtype))
    if device.type == "cpu":
        from tgi_llm.runner.model_runner import keep_freed_memory_in_heap

        # The engine's runner sets this glibc policy process-wide; without it transformers spends most of a
        # CPU decode step in page faults (measured 3-4x slower here), which would not be batching's doing.
        keep_freed_memory_in_heap()
    model = load_hf_model(model_dir, dtype, device)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
    warm_up(model, pad)
    plans = []
    if "static" not in args.skip:
        plans.append((STATIC, args.static_batch_size, requests))
    if "serial" not in args.skip:
        plans.append((SERIAL, 1, requests[:args.serial_num_requests or len(requests)]))
    for system, batch, reqs in plans:
        records, wall = run_static_batches(model, reqs, batch, pad, args.progress, f"{system}")
        results.runs.append(SystemRun(summarize(system, records, wall), batch_size=batch))
        _save_partial(results, args.out_dir)
    del model


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    args.command = None if argv is None else shlex.join(["tgi-llm-bench", *argv])
    from tgi_llm.bench.report import write_report

    in_main = threading.current_thread() is threading.main_thread()
    # SIGTERM unwinds like Ctrl-C, so a launched server is still stopped on the way out.
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143)) if in_main else None
    try:
        results = run(args)
    finally:
        if in_main:
            signal.signal(signal.SIGTERM, previous)
    paths = write_report(results, args.out_dir)
    (args.out_dir / "bench.partial.json").unlink(missing_ok=True)
    print(paths["markdown"].read_text())
    print("wrote " + ", ".join(str(p) for p in paths.values()), file=sys.stderr)
    failed = sum(r.summary.failed for r in results.runs)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
