"""The TGI/OpenAI HTTP front (`tgi_llm.front`) as a child of the launcher, talking to Triton over gRPC."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path

from tgi_llm.launcher.process import ServerProcess, _die_with_parent
from tgi_llm.launcher.repository import MODEL_NAME
from tgi_llm.launcher.tritonserver import ServerConfig

logger = logging.getLogger("tgi_llm.launcher")

STOP_TIMEOUT_S = 35.0  # uvicorn lets in-flight requests finish for up to 30 s


def front_command(args: argparse.Namespace, model_dir: Path, config: ServerConfig, connect_host: str) -> list[str]:
    from tgi_llm.front.config import InfoLimits

    command = [
        sys.executable, "-m", "tgi_llm.front.main", "--port", str(args.port), "--hostname", args.hostname,
        "--triton-grpc-url", f"{connect_host}:{config.grpc_port}",
        "--triton-metrics-url", f"http://{connect_host}:{config.metrics_port}/metrics",
        "--model-name", MODEL_NAME, "--model-id", args.model_id or _default_model_id(),
        "--tokenizer-dir", str(model_dir), "--log-level", args.log_level,
    ]
    if args.dtype:
        command += ["--dtype", args.dtype]
    reported = vars(args) | _derived_limits(args, model_dir)
    for f in fields(InfoLimits):
        value = reported.get(f.name)
        if value is not None:
            command += [f"--{f.name.replace('_', '-')}", str(value)]
    return command


def _derived_limits(args: argparse.Namespace, model_dir: Path) -> dict[str, int]:
    """The per-request limits the model will derive (TGI's defaults), so /info can report them.
    max_batch_total_tokens depends on the KV-cache memory and is reported only when given."""
    from tgi_llm.engine.limits import default_step_tokens, resolve_limits
    from tgi_llm.launcher.args import limit_options
    from tgi_llm.launcher.tritonserver import has_gpu

    try:
        positions = json.loads((model_dir / "config.json").read_text(encoding="utf-8")).get("max_position_embeddings")
    except (OSError, ValueError):
        positions = None
    limits = resolve_limits(limit_options(args), positions, kv_cache_tokens=2**31,
                            default_step_tokens=default_step_tokens("cuda" if has_gpu() else "cpu"))
    return {"max_input_tokens": limits.max_input_tokens, "max_total_tokens": limits.max_total_tokens,
            "max_batch_prefill_tokens": limits.max_batch_prefill_tokens}


def _default_model_id() -> str:
    from tgi_llm.weights import DEFAULT_MODEL_ID

    return DEFAULT_MODEL_ID


class FrontProcess:
    def __init__(self, command: list[str], api_key: str | None) -> None:
        self.command = command
        self.env = dict(os.environ)
        if api_key:
            self.env["API_KEY"] = api_key  # in the environment, not on the command line where `ps` shows it
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(self.command, env=self.env, start_new_session=True,
                                        preexec_fn=_die_with_parent)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def wait_ready(self, url: str, give_up: Callable[[], bool] = lambda: False, timeout_s: float = 120.0) -> bool:
        """True once `url` answers 200; False if the front exits, `give_up()` turns true or time runs out."""
        deadline = time.monotonic() + timeout_s
        while self.alive() and not give_up() and time.monotonic() < deadline:
            if ServerProcess.is_ready(url):
                return True
            time.sleep(0.2)
        return False

    def stop(self) -> int | None:
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                logger.warning("the HTTP front did not stop in %.0f s: killing it", STOP_TIMEOUT_S)
                self.process.kill()
        return self.process.wait()
