"""`python -m tgi_llm.gateway.main`: serve Triton's public HTTP, gRPC and metrics ports in front of a
tritonserver that listens on 127.0.0.1 only. The launcher starts it; see tgi_llm/gateway/__init__.py."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import socket
from collections.abc import Sequence

from tgi_llm.gateway.body import DEFAULT_PAYLOAD_LIMIT

logger = logging.getLogger("tgi_llm.gateway")

#: In-flight requests end when tritonserver does (the launcher stops it first), so a short grace suffices.
GRACE_S = 5.0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tgi-llm-gateway", description=__doc__)
    p.add_argument("--hostname", default="0.0.0.0")
    p.add_argument("--http-port", type=int, required=True)
    p.add_argument("--grpc-port", type=int, required=True)
    p.add_argument("--metrics-port", type=int, required=True)
    p.add_argument("--triton-http-url", required=True, help="http://127.0.0.1:<port> of tritonserver's HTTP")
    p.add_argument("--triton-grpc-url", required=True, help="127.0.0.1:<port> of tritonserver's gRPC")
    p.add_argument("--triton-metrics-url", required=True, help="http://127.0.0.1:<port>/metrics")
    p.add_argument("--model-name", default="tgi_llm")
    p.add_argument("--payload-limit", type=int, default=DEFAULT_PAYLOAD_LIMIT)
    p.add_argument("--request-read-timeout", type=float, default=30.0)
    p.add_argument("--log-level", default="info")
    p.add_argument("--json-output", action="store_true")
    return p


def bind(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host.strip("[]"), port))
    return sock


def _grpc_address(host: str, port: int) -> str:
    return f"[{host.strip('[]')}]:{port}" if ":" in host else f"{host}:{port}"


async def serve(args: argparse.Namespace) -> None:
    import grpc
    import uvicorn

    from tgi_llm.gateway.api_key import ApiKey
    from tgi_llm.gateway.body import BodyLimit
    from tgi_llm.gateway.deadline import protocol_with_deadline
    from tgi_llm.gateway.grpc_proxy import GrpcGateway
    from tgi_llm.gateway.http_proxy import GatewayApp, too_large_app

    api_key = ApiKey.from_env()
    app = GatewayApp(args.triton_http_url, args.triton_grpc_url, args.triton_metrics_url, args.model_name,
                     args.metrics_port, api_key)
    config = uvicorn.Config(
        BodyLimit(app, args.payload_limit, too_large_app), http=protocol_with_deadline(args.request_read_timeout),
        lifespan="on", log_config=None, access_log=False, server_header=False, timeout_graceful_shutdown=GRACE_S,
    )
    server = uvicorn.Server(config)
    sockets = [bind(args.hostname, args.http_port), bind(args.hostname, args.metrics_port)]
    gateway = GrpcGateway(args.triton_grpc_url, args.model_name, args.payload_limit, api_key)
    grpc_server = grpc.aio.server(options=[
        ("grpc.max_receive_message_length", args.payload_limit), ("grpc.max_send_message_length", -1),
        ("grpc.so_reuseport", 0),
    ])
    grpc_server.add_generic_rpc_handlers((gateway,))
    grpc_server.add_insecure_port(_grpc_address(args.hostname, args.grpc_port))
    await grpc_server.start()

    def stop(_signum: int, _frame: object) -> None:
        server.should_exit = True

    # uvicorn installs its own handlers while serving and re-raises the signal after: into these.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, stop)
    logger.info("gateway serving HTTP %s:%d, gRPC %s:%d, metrics %s:%d -> tritonserver %s, %s", args.hostname,
                args.http_port, args.hostname, args.grpc_port, args.hostname, args.metrics_port,
                args.triton_http_url, args.triton_grpc_url)
    try:
        await server.serve(sockets=sockets)
    finally:
        await grpc_server.stop(GRACE_S)
        await gateway.close()


def main(argv: Sequence[str] | None = None) -> int:
    from tgi_llm.launcher.logs import setup_logging

    args = build_parser().parse_args(argv)
    setup_logging(args.log_level, args.json_output)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per forwarded request otherwise
    asyncio.run(serve(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
