"""`tgi-llm-front`: serve TGI's and OpenAI's HTTP APIs on --port over a running Triton's gRPC port."""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Sequence
from dataclasses import fields

from tgi_llm.front.config import FrontConfig, InfoLimits
from tgi_llm.front.reasoning import REASONING_FORMATS
from tgi_llm.gateway.body import DEFAULT_PAYLOAD_LIMIT

logger = logging.getLogger("tgi_llm.front")


def _env(name: str, default: str | None = None) -> str | None:
    value = os.environ.get(name)
    return value if value not in (None, "") else default


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tgi-llm-front", description=__doc__)
    # TGI's router reads the same environment variables.
    p.add_argument("--port", type=int, default=int(_env("PORT", "3000")))
    p.add_argument("--hostname", default="0.0.0.0")
    p.add_argument("--triton-grpc-url", default="127.0.0.1:8001", help="host:port of Triton's gRPC endpoint")
    p.add_argument("--triton-metrics-url", default="http://127.0.0.1:8002/metrics", help="'' disables /metrics")
    p.add_argument("--model-name", default="tgi_llm", help="the Triton model to call")
    p.add_argument("--model-id", default=None, help="the name /info, /v1/models and OpenAI responses report")
    p.add_argument("--tokenizer-dir", default=None, help="HF directory with the tokenizer (chat template, /tokenize)")
    p.add_argument("--api-key", default=_env("API_KEY"), help="require `Authorization: Bearer <key>`")
    p.add_argument("--dtype", default=None)
    p.add_argument("--model-family", default=None,
                   help="what /info names as the code serving the model: a native family or `transformers`")
    p.add_argument("--reasoning-format", choices=REASONING_FORMATS, default="auto",
                   help="auto: a thinking model's <think> part as `reasoning_content`; none: left in the content")
    p.add_argument("--lora", choices=("off", "startup", "runtime"), default="off",
                   help="LoRA adapters: OpenAI's `model` may name one (startup), and with runtime the load and unload "
                        "routes are served")
    p.add_argument("--log-level", default=_env("LOG_LEVEL", "info"))
    p.add_argument("--json-output", action="store_true", help="log JSON lines, as the launcher's --json-output")
    p.add_argument("--payload-limit", type=int, default=int(_env("PAYLOAD_LIMIT", str(DEFAULT_PAYLOAD_LIMIT))))
    p.add_argument("--request-read-timeout", type=float, default=30.0,
                   help="seconds a client has to send a whole request before its connection is closed")
    for f in fields(InfoLimits):
        kind = float if f.type in ("float", float) else int
        p.add_argument(f"--{f.name.replace('_', '-')}", type=kind, default=None, dest=f.name)
    return p


def config_from_args(args: argparse.Namespace) -> FrontConfig:
    given = {f.name: getattr(args, f.name) for f in fields(InfoLimits)}
    limits = InfoLimits(**{name: value for name, value in given.items() if value is not None})
    return FrontConfig(
        model_id=args.model_id or args.model_name,
        model_name=args.model_name,
        api_key=args.api_key or None,
        payload_limit=args.payload_limit,
        limits=limits,
        model_dtype=args.dtype,
        model_family=args.model_family,
        reasoning_format=args.reasoning_format,
        lora=args.lora,
    )


def main(argv: Sequence[str] | None = None) -> int:
    from tgi_llm.launcher.logs import setup_logging

    args = build_parser().parse_args(argv)
    setup_logging(args.log_level, args.json_output)
    import uvicorn

    from tgi_llm.front.app import create_app
    from tgi_llm.front.triton_client import TritonGrpcClient
    from tgi_llm.gateway.deadline import protocol_with_deadline

    tokenizer = None
    if args.tokenizer_dir:
        from tgi_llm.front.tokenizer import load_tokenizer

        tokenizer = load_tokenizer(args.tokenizer_dir)
    else:
        logger.warning("no --tokenizer-dir: /v1/chat/completions and /tokenize are unavailable")
    config = config_from_args(args)
    client = TritonGrpcClient(args.triton_grpc_url, args.model_name, args.triton_metrics_url or None,
                              api_key=config.api_key)
    app = create_app(config, client, tokenizer)
    logger.info("serving %s on http://%s:%d (Triton gRPC %s)", config.model_id, args.hostname, args.port,
                args.triton_grpc_url)
    uvicorn.run(app, host=args.hostname, port=args.port, log_config=None, timeout_graceful_shutdown=30,
                http=protocol_with_deadline(args.request_read_timeout))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
