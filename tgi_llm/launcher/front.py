"""The TGI/OpenAI HTTP front (`tgi_llm.front`) as a child of the launcher, talking to Triton over gRPC."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from dataclasses import fields
from pathlib import Path

from tgi_llm.launcher.repository import MODEL_NAME
from tgi_llm.launcher.tritonserver import ServerConfig

logger = logging.getLogger("tgi_llm.launcher")

STOP_TIMEOUT_S = 35.0  # uvicorn lets in-flight requests finish for up to 30 s


def front_command(args: argparse.Namespace, model_dir: Path, triton: ServerConfig) -> list[str]:
    """The front talks to tritonserver's loopback gRPC port directly (the gateway serves outside clients)."""
    from tgi_llm.front.config import InfoLimits
    from tgi_llm.launcher.args import lora_mode

    command = [
        sys.executable, "-m", "tgi_llm.front.main", "--port", str(args.port), "--hostname", args.hostname,
        "--triton-grpc-url", f"{triton.hostname}:{triton.grpc_port}",
        "--triton-metrics-url", f"http://{triton.hostname}:{triton.metrics_port}/metrics",
        "--model-name", MODEL_NAME, "--model-id", args.model_id or _default_model_id(),
        "--tokenizer-dir", str(model_dir), "--log-level", args.log_level,
        "--payload-limit", str(args.payload_limit), "--request-read-timeout", str(args.request_read_timeout),
        "--reasoning-format", args.reasoning_format, "--lora", lora_mode(args),
    ]
    if args.dtype:
        command += ["--dtype", args.dtype]
    if (family := _model_family(model_dir)) is not None:
        command += ["--model-family", family]
    if args.json_output:
        command.append("--json-output")
    reported = vars(args) | _derived_limits(args, model_dir)
    for f in fields(InfoLimits):
        value = reported.get(f.name)
        if value is not None:
            command += [f"--{f.name.replace('_', '-')}", str(value)]
    return command


def _model_family(model_dir: Path) -> str | None:
    """The family that will serve the model (no torch: the registry reads config.json only), or None where it
    cannot tell; the model's own load then reports why."""
    from tgi_llm.models.registry import read_config_dir

    try:
        return read_config_dir(model_dir).family
    except (OSError, ValueError, KeyError, TypeError) as exc:
        logger.debug("no model family for /info: %s", exc)
        return None


def _derived_limits(args: argparse.Namespace, model_dir: Path) -> dict[str, int]:
    """The per-request limits the model will derive (TGI's defaults), so /info can report them.
    max_batch_total_tokens depends on the KV-cache memory and is reported only when given."""
    from tgi_llm.engine.limits import default_step_tokens, resolve_limits
    from tgi_llm.launcher.args import limit_options
    from tgi_llm.launcher.tritonserver import has_gpu
    from tgi_llm.models.rope_override import RopeOverride

    try:
        positions = json.loads((model_dir / "config.json").read_text(encoding="utf-8")).get("max_position_embeddings")
    except (OSError, ValueError):
        positions = None
    rope = RopeOverride.from_flags(args.rope_scaling, args.rope_factor)
    if rope is not None and positions is not None:  # the context the engine's limits take (builder.py)
        positions = rope.context(positions)
    limits = resolve_limits(limit_options(args), positions, kv_cache_tokens=2**31,
                            default_step_tokens=default_step_tokens("cuda" if has_gpu() else "cpu"))
    return {"max_input_tokens": limits.max_input_tokens, "max_total_tokens": limits.max_total_tokens,
            "max_batch_prefill_tokens": limits.max_batch_prefill_tokens}


def _default_model_id() -> str:
    from tgi_llm.weights import DEFAULT_MODEL_ID

    return DEFAULT_MODEL_ID
