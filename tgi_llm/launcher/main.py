"""`tgi-llm-launcher`: check the flags as TGI does, prepare the weights, write the model repository,
start tritonserver on it, wait until the model is ready, and stop it gracefully on SIGINT/SIGTERM.

Exit status: 0 after a requested stop, 1 when the flags are invalid, the weights cannot be
prepared, tritonserver is missing, or the model fails to load; tritonserver's own status when it
stops by itself.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from tgi_llm.errors import ArgumentValidationError
from tgi_llm.launcher.args import model_parameters, parse_args, validate
from tgi_llm.launcher.front import FrontProcess, front_command
from tgi_llm.launcher.logs import setup_logging
from tgi_llm.launcher.process import ServerProcess
from tgi_llm.launcher.repository import MODEL_NAME, write_repository
from tgi_llm.launcher.tritonserver import ServerConfig, find_tritonserver, server_command, server_env
from tgi_llm.procfs import pid_alive

logger = logging.getLogger("tgi_llm.launcher")


def _error(kind: str, message: str) -> int:
    # TGI prints its LauncherError as `Error: Kind("message")` and exits with 1.
    logger.error("%s", message)
    print(f'Error: {kind}("{message}")', file=sys.stderr)
    return 1


def prepare_weights(model_id: str | None, revision: str | None) -> Path:
    """Download (hub) or convert (GGUF) once, with progress, so the model loads from a local directory."""
    from tgi_llm.weights import resolve_model_dir

    target = f"{model_id}@{revision}" if model_id and revision else model_id
    logger.info("Preparing weights for %s", target or "the default model")
    model_dir = resolve_model_dir(target, progress=True)
    logger.info("Weights ready in %s", model_dir)
    return model_dir


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = parse_args(argv)
    except ArgumentValidationError as exc:
        return _error("ArgumentValidation", str(exc))
    setup_logging(args.log_level, args.json_output)
    logger.info("Args %s", vars(args))
    try:
        validate(args)
    except ArgumentValidationError as exc:
        return _error("ArgumentValidation", str(exc))
    if args.huggingface_hub_cache:
        os.environ["HF_HUB_CACHE"] = os.environ["HUGGINGFACE_HUB_CACHE"] = args.huggingface_hub_cache
    try:
        model_dir = prepare_weights(args.model_id, args.revision)
    except Exception as exc:
        name = args.model_id or "the default model"
        return _error("DownloadError", f"could not prepare the weights of {name}: {exc}")

    owned = args.model_repository is None
    work_dir = Path(tempfile.mkdtemp(prefix="tgi-llm-")) if owned else Path(args.model_repository)
    try:
        return _serve(args, model_dir, work_dir)
    finally:
        if owned:
            shutil.rmtree(work_dir, ignore_errors=True)


def _serve(args, model_dir: Path, work_dir: Path) -> int:
    repo = write_repository(work_dir / "repository", model_parameters(args, str(model_dir)))
    try:
        install = find_tritonserver(work_dir, args.tritonserver)
    except FileNotFoundError as exc:
        return _error("TritonNotFound", str(exc))
    config = ServerConfig(
        model_repository=repo, hostname=args.hostname, http_port=args.http_port, grpc_port=args.grpc_port,
        metrics_port=args.metrics_port, log_verbose=1 if logging.getLogger().level <= logging.DEBUG else 0,
        exit_timeout_s=args.graceful_termination_timeout,
    )
    command = server_command(install, config)
    logger.info("Starting tritonserver (%s): %s", install.source, " ".join(command))
    server = ServerProcess(command, server_env(install), json_output=args.json_output)
    with server.forward_signals():
        server.start()
        if not server.wait_ready(_ready_url(config)):
            if server.stop_requested:
                return server.wait()
            if server.model_unloaded.is_set():
                server.request_stop()
                server.wait()
                return _error("ShardFailed", f"model `{MODEL_NAME}` unloaded itself: its engine or a shard failed")
            code = server.wait()
            reason = f": {server.load_error}" if server.load_error else " (see tritonserver's log above)"
            return _error("ModelLoad", f"tritonserver exited with status {code} before model `{MODEL_NAME}` was "
                          f"ready: the model failed to load{reason}")
        host = _connect_host(config.hostname)
        front = None
        if args.port:
            front = FrontProcess(front_command(args, model_dir, config, host), args.api_key)
            front.start()
            # A stop requested meanwhile (SIGTERM) or a dead tritonserver ends the wait: the front's /health
            # would answer 503 until the timeout.
            if not front.wait_ready(f"http://{host}:{args.port}/health",
                                    give_up=lambda: server.stop_requested or server.process.poll() is not None):
                if server.stop_requested:
                    front.stop()
                    return server.wait()
                server.request_stop()
                server.wait()
                front.stop()
                return _error("WebserverFailed", f"the HTTP API did not start on port {args.port}")
            logger.info("Ready: TGI/OpenAI API http://%s:%d", host, args.port)
        logger.info("Ready: HTTP http://%s:%d/v2/models/%s/generate (and generate_stream), gRPC %s:%d, "
                    "metrics http://%s:%d/metrics", host, config.http_port, MODEL_NAME, host, config.grpc_port,
                    host, config.metrics_port)
        try:
            code = _wait(server, front, _ready_url(config))
        except _Failed as exc:
            return _error("ShardFailed", str(exc))
    if server.stop_requested:
        logger.info("tritonserver stopped (status %d)", code)
        return code
    return _error("ServerExited", f"tritonserver exited unexpectedly with status {code}") if code else 0


class _Failed(Exception):
    """The model or the front died while tritonserver kept running."""


def _wait(server: ServerProcess, front: FrontProcess | None, ready_url: str) -> int:
    """Until tritonserver exits. If the front dies, the model stops being ready (its engine or a shard
    died and it unloaded itself), or the model's process dies (killed, crashed: Triton would go on calling
    the model ready and fail every request), stop tritonserver and fail, as TGI's launcher does on a crash."""
    failure = None
    next_check = time.monotonic() + 1.0
    model_pids = server.model_processes(MODEL_NAME)
    if not model_pids:
        logger.warning("model `%s`'s process not found under tritonserver: its death would go unnoticed", MODEL_NAME)
    while server.process.poll() is None:
        if not server.stop_requested and failure is None:
            if front is not None and not front.alive():
                failure = f"the HTTP API exited with status {front.process.poll()} (Webserver Crashed)"
            elif server.model_unloaded.is_set():
                failure = f"model `{MODEL_NAME}` is no longer ready: its engine or a shard failed"
            elif time.monotonic() >= next_check:
                next_check = time.monotonic() + 1.0
                if model_pids and not any(pid_alive(p) for p in model_pids):
                    failure = (f"model `{MODEL_NAME}`'s process (Triton's Python backend stub, pid "
                               f"{', '.join(map(str, model_pids))}) died: killed or crashed")
                elif not server.is_ready(ready_url):
                    failure = f"model `{MODEL_NAME}` is no longer ready: its engine or a shard failed"
            if failure is not None:
                logger.error("%s: stopping tritonserver", failure)
                server.request_stop()
        time.sleep(0.2)
    if front is not None:
        front.stop()
    code = server.wait()
    if failure is not None:
        raise _Failed(failure)
    return code


def _connect_host(hostname: str) -> str:
    return {"0.0.0.0": "127.0.0.1", "::": "[::1]", "": "127.0.0.1"}.get(hostname, hostname)


def _ready_url(config: ServerConfig) -> str:
    return f"http://{_connect_host(config.hostname)}:{config.http_port}/v2/models/{MODEL_NAME}/ready"


if __name__ == "__main__":
    raise SystemExit(main())
