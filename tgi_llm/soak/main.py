"""`tools/soak`: N requests over Triton gRPC, Triton HTTP and the OpenAI front (~20% cancelled after their
first token, ~5% invalid), `--concurrency` at a time, bounded by `--time-limit-s`; then the report
(soak/report.py). Exit status 0 when every check passed.

    tools/soak --launch --num-requests 5000 --json soak.json        # its own server, the default model
    tools/soak --grpc-url H:8001 --http-url http://H:8000 --metrics-url http://H:8002/metrics \
        --front-url http://H:3000                                    # a running server (no RSS curve)
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tgi_llm.soak.clients import Result, Targets, run
from tgi_llm.soak.observe import metric, model_process, read_metrics, rss_bytes
from tgi_llm.soak.plan import PROTOCOLS, make_plan
from tgi_llm.soak.report import build_report, markdown

#: Limits of a --launch server: small enough for a laptop, the KV pool a few hundred blocks.
LAUNCH_FLAGS = ["--max-input-tokens", "256", "--max-total-tokens", "512", "--max-batch-total-tokens", "16384"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tools/soak", description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--launch", action="store_true", help="start tgi-llm-launcher (with its front) for the run")
    p.add_argument("--model-id", default=None, help="with --launch (default: the default model)")
    p.add_argument("--launcher-flag", action="append", default=[], help="with --launch: one more launcher argument")
    p.add_argument("--grpc-url", help="Triton gRPC host:port")
    p.add_argument("--http-url", help="Triton HTTP http://host:port")
    p.add_argument("--metrics-url", help="http://host:port/metrics")
    p.add_argument("--front-url", help="the TGI/OpenAI front http://host:port (omit to skip the openai protocol)")
    p.add_argument("--num-requests", type=int, default=5000)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--cancel-fraction", type=float, default=0.2)
    p.add_argument("--invalid-fraction", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--time-limit-s", type=float, default=3600.0, help="requests not started by then are not sent")
    p.add_argument("--rss-every", type=int, default=100, help="sample the model process's RSS every N requests")
    p.add_argument("--check-rss", action="store_true",
                   help="fail unless RSS grew < 2%% over the second half (meaningful for thousands of requests)")
    p.add_argument("--json", type=Path, help="write the report as JSON here")
    p.add_argument("--markdown", type=Path, help="write the report as markdown here")
    return p


def soak(args: argparse.Namespace, targets: Targets, metrics_url: str, model_pid: int | None) -> int:
    protocols = PROTOCOLS if targets.front else tuple(p for p in PROTOCOLS if p != "openai")
    plan = make_plan(args.num_requests, args.cancel_fraction, args.invalid_fraction, args.seed, protocols)
    before = read_metrics(metrics_url)
    results: list[Result] = []
    curve: list[tuple[int, int]] = []
    lock = threading.Lock()
    start = time.monotonic()
    deadline = start + args.time_limit_s

    def one(planned) -> None:
        if time.monotonic() > deadline:
            return  # bounded in time: not sent
        result = run(targets, planned)
        with lock:
            results.append(result)
            done = len(results)
            if model_pid is not None and (done == 1 or done % args.rss_every == 0):
                rss = rss_bytes(model_pid)
                if rss is not None:
                    curve.append((done, rss))
            if done % max(1, args.num_requests // 20) == 0:
                print(f"[soak] {done}/{args.num_requests} requests, {time.monotonic() - start:.0f} s",
                      file=sys.stderr, flush=True)

    with ThreadPoolExecutor(max_workers=args.concurrency, thread_name_prefix="soak") as pool:
        list(pool.map(one, plan))
    seconds = time.monotonic() - start
    after = _settled_metrics(metrics_url)
    if model_pid is not None and (not curve or curve[-1][0] != len(results)):
        rss = rss_bytes(model_pid)
        if rss is not None:
            curve.append((len(results), rss))
    report = build_report(len(plan), sorted(results, key=lambda r: r.index), seconds, before, after, curve,
                          args.check_rss)
    text = markdown(report)
    print(text)
    if args.json:
        args.json.write_text(json.dumps(report.to_json(), indent=1))
    if args.markdown:
        args.markdown.write_text(text + "\n")
    return 0 if report.passed else 1


def _settled_metrics(url: str, timeout_s: float = 30.0) -> dict:
    """Metrics once nothing is queued or running (cancellations land within ~100 ms; metrics after that)."""
    deadline = time.monotonic() + timeout_s
    while True:
        snap = read_metrics(url)
        idle = metric(snap, "tgi_queue_size") == 0 and metric(snap, "tgi_batch_current_size") == 0 \
            and metric(snap, "tgi_kv_blocks_free") == metric(snap, "tgi_kv_blocks_total")
        if idle or time.monotonic() > deadline:
            time.sleep(0.5)  # the responder records metrics after the last responses
            return read_metrics(url)
        time.sleep(0.2)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not args.launch:
        if not (args.grpc_url and args.http_url and args.metrics_url):
            build_parser().error("give --launch, or --grpc-url, --http-url and --metrics-url")
        targets = Targets(args.grpc_url, args.http_url.rstrip("/"), args.front_url)
        return soak(args, targets, args.metrics_url, None)
    from tgi_llm.bench.server import launch
    from tgi_llm.ports import free_ports

    (front_port,) = free_ports(1)
    flags = LAUNCH_FLAGS + (["--model-id", args.model_id] if args.model_id else []) + ["--port", str(front_port)]
    log = Path(tempfile.mkdtemp(prefix="tgi-llm-soak-")) / "launcher.log"
    print(f"[soak] starting the server (log: {log})", file=sys.stderr, flush=True)
    server = launch(flags + args.launcher_flag, log)
    try:
        front = f"http://127.0.0.1:{front_port}"
        _wait_front(front)
        targets = Targets(server.grpc_url, server.http_url, front)
        code = soak(args, targets, server.metrics_url, model_process(server.process.pid))
    finally:
        stop_code = server.stop()
    if stop_code != 0:
        print(f"[soak] the launcher exited with status {stop_code} on SIGTERM", file=sys.stderr)
        return 1
    return code


def _wait_front(url: str, timeout_s: float = 120.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"the front at {url} did not become healthy")


if __name__ == "__main__":
    raise SystemExit(main())
