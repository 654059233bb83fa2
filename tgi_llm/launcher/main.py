"""`tgi-llm-launcher`: check the flags as TGI does, prepare the weights, write the model repository,
start tritonserver on it, wait until the model is ready, and stop it gracefully on SIGINT/SIGTERM.

Exit status: 0 after a requested stop; 1 when the flags are invalid, the weights cannot be prepared,
tritonserver is missing, the model fails to load, or the model fails while serving and is not (or no
longer) restarted (--on-model-failure, tgi_llm/launcher/supervisor.py).
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from tgi_llm.errors import ArgumentValidationError
from tgi_llm.launcher.args import model_parameters, parse_args, validate
from tgi_llm.launcher.child import ChildProcess, env_with_api_key
from tgi_llm.launcher.front import STOP_TIMEOUT_S as FRONT_STOP_TIMEOUT_S
from tgi_llm.launcher.front import front_command
from tgi_llm.launcher.gateway import STOP_TIMEOUT_S as GATEWAY_STOP_TIMEOUT_S
from tgi_llm.launcher.gateway import gateway_command
from tgi_llm.launcher.kernels_step import start_kernels_step
from tgi_llm.launcher.logs import setup_logging
from tgi_llm.launcher.process import ServerProcess
from tgi_llm.launcher.repository import MODEL_NAME, write_repository
from tgi_llm.launcher.security import Restrictions
from tgi_llm.launcher.supervisor import Failed, RestartPolicy, Supervisor
from tgi_llm.launcher.tritonserver import ServerConfig, find_tritonserver, server_command, server_env
from tgi_llm.launcher.weights_step import prepare_in_child
from tgi_llm.ports import free_ports

logger = logging.getLogger("tgi_llm.launcher")


def _error(kind: str, message: str) -> int:
    # TGI prints its LauncherError as `Error: Kind("message")` and exits with 1.
    logger.error("%s", message)
    print(f'Error: {kind}("{message}")', file=sys.stderr)
    return 1


def prepare_weights(model_id: str | None, revision: str | None, log_level: str, json_output: bool) -> Path:
    """Download (hub) or convert (GGUF) once, with progress, so the model loads from a local directory.
    In a child process: the launcher never imports torch (weights_step.py)."""
    target = f"{model_id}@{revision}" if model_id and revision else model_id
    logger.info("Preparing weights for %s", target or "the default model")
    model_dir = prepare_in_child(target, log_level, json_output)
    logger.info("Weights ready in %s", model_dir)
    return model_dir


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = parse_args(argv)
    except ArgumentValidationError as exc:
        return _error("ArgumentValidation", str(exc))
    setup_logging(args.log_level, args.json_output)
    logger.info("Args %s", vars(args) | ({"api_key": "***"} if args.api_key else {}))
    try:
        validate(args)
    except ArgumentValidationError as exc:
        return _error("ArgumentValidation", str(exc))
    if args.huggingface_hub_cache:
        os.environ["HF_HUB_CACHE"] = os.environ["HUGGINGFACE_HUB_CACHE"] = args.huggingface_hub_cache
    kernels = start_kernels_step(args.log_level, args.json_output)  # beside the weights step: a core each
    try:
        return _prepare_and_serve(args)
    finally:
        if kernels is not None:
            kernels.stop()


def _prepare_and_serve(args) -> int:
    try:
        model_dir = prepare_weights(args.model_id, args.revision, args.log_level, args.json_output)
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
    restrictions = Restrictions.new(args.api_key)
    http, grpc, metrics = free_ports(3, exclude={args.http_port, args.grpc_port, args.metrics_port, args.port})
    # tritonserver on loopback ports only: the gateway serves the public ones (tgi_llm/gateway).
    triton = ServerConfig(
        model_repository=repo, hostname="127.0.0.1", http_port=http, grpc_port=grpc, metrics_port=metrics,
        log_verbose=1 if logging.getLogger().level <= logging.DEBUG else 0,
        exit_timeout_s=args.graceful_termination_timeout, extra_args=tuple(restrictions.triton_args()),
    )
    command = server_command(install, triton)
    secrets = [restrictions.admin_secret, args.api_key or ""]
    logger.info("Starting tritonserver (%s): %s", install.source, _redacted(" ".join(command), secrets))
    env = server_env(install)

    def make_server() -> ServerProcess:
        return ServerProcess(command, env, json_output=args.json_output, model=MODEL_NAME, redact=secrets)

    ready_url = f"http://{triton.hostname}:{triton.http_port}/v2/models/{MODEL_NAME}/ready"
    supervisor = Supervisor(make_server, ready_url, MODEL_NAME,
                            RestartPolicy(args.on_model_failure, args.max_model_restarts))
    children: list[ChildProcess] = []
    with supervisor.signals():
        gateway = ChildProcess("gateway", gateway_command(args, triton), env_with_api_key(args.api_key),
                               GATEWAY_STOP_TIMEOUT_S)
        gateway.start()
        children.append(gateway)
        try:
            return _run(args, model_dir, triton, supervisor, children)
        finally:
            for child in children:
                child.terminate()
            for child in children:
                child.stop()


def _run(args, model_dir: Path, triton: ServerConfig, supervisor: Supervisor, children: list[ChildProcess]) -> int:
    gateway = children[0]
    front = None
    if args.port:  # started now, its imports beside the model's load; its /health is 503 until the model is ready
        front = ChildProcess("HTTP front", front_command(args, model_dir, triton), env_with_api_key(args.api_key),
                             FRONT_STOP_TIMEOUT_S)
        front.start()
        children.append(front)
    if not supervisor.start():
        code = supervisor.end_failed_start()
        if supervisor.stopping:
            return _stopped(code)
        server = supervisor.server
        if server.model_unloaded.is_set():
            return _error("ShardFailed", f"model `{MODEL_NAME}` unloaded itself: its engine or a shard failed")
        reason = f": {server.load_error}" if server.load_error else " (see tritonserver's log above)"
        return _error("ModelLoad", f"tritonserver exited with status {code} before model `{MODEL_NAME}` was "
                      f"ready: the model failed to load{reason}")
    host = _connect_host(args.hostname)
    stopping = lambda: supervisor.stopping  # noqa: E731
    if not gateway.wait_ready(f"http://{host}:{args.http_port}/v2/health/live", expect_status=0, give_up=stopping):
        requested = stopping()
        code = supervisor.end_failed_start()
        if requested:
            return _stopped(code)
        return _error("WebserverFailed", f"the gateway did not start on ports {args.http_port}, {args.grpc_port} "
                      f"and {args.metrics_port}")
    if front is not None:
        if not front.wait_ready(f"http://{host}:{args.port}/health", give_up=stopping):
            requested = stopping()
            code = supervisor.end_failed_start()
            if requested:
                return _stopped(code)
            return _error("WebserverFailed", f"the HTTP API did not start on port {args.port}")
        logger.info("Ready: TGI/OpenAI API http://%s:%d", host, args.port)
    logger.info("Ready: HTTP http://%s:%d/v2/models/%s/generate (and generate_stream), gRPC %s:%d, "
                "metrics http://%s:%d/metrics", host, args.http_port, MODEL_NAME, host, args.grpc_port,
                host, args.metrics_port)
    try:
        code = supervisor.run(children)
    except Failed as exc:
        return _error("ShardFailed", str(exc))
    return _stopped(code)


def _stopped(code: int) -> int:
    """A requested stop ended tritonserver: said the same way whether it came before or after "Ready"."""
    logger.info("tritonserver stopped (status %d)", code)
    return code


def _redacted(text: str, secrets: list[str]) -> str:
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return text


def _connect_host(hostname: str) -> str:
    return {"0.0.0.0": "127.0.0.1", "::": "[::1]", "": "127.0.0.1"}.get(hostname, hostname)


if __name__ == "__main__":
    raise SystemExit(main())
