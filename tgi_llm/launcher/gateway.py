"""The gateway (tgi_llm.gateway) as a child of the launcher: it holds Triton's public ports and forwards
to tritonserver's loopback ones."""

from __future__ import annotations

import argparse
import sys

from tgi_llm.launcher.repository import MODEL_NAME
from tgi_llm.launcher.tritonserver import ServerConfig

STOP_TIMEOUT_S = 10.0  # the gateway's own grace is 5 s


def gateway_command(args: argparse.Namespace, triton: ServerConfig) -> list[str]:
    host = triton.hostname
    command = [
        sys.executable, "-m", "tgi_llm.gateway.main", "--hostname", args.hostname, "--http-port", str(args.http_port),
        "--grpc-port", str(args.grpc_port), "--metrics-port", str(args.metrics_port),
        "--triton-http-url", f"http://{host}:{triton.http_port}", "--triton-grpc-url", f"{host}:{triton.grpc_port}",
        "--triton-metrics-url", f"http://{host}:{triton.metrics_port}/metrics", "--model-name", MODEL_NAME,
        "--payload-limit", str(args.payload_limit), "--request-read-timeout", str(args.request_read_timeout),
        "--log-level", args.log_level,
    ]
    if args.json_output:
        command.append("--json-output")
    return command
