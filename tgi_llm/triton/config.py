"""The model config's `parameters` (string values) as the engine and responder options."""

from __future__ import annotations

from typing import Any


def config_parameters(model_config: dict[str, Any]) -> dict[str, str]:
    """{"key": {"string_value": "v"}} -> {"key": "v"}; empty values mean "unset" downstream."""
    out: dict[str, str] = {}
    for key, value in (model_config.get("parameters") or {}).items():
        out[key] = value.get("string_value", "") if isinstance(value, dict) else str(value)
    return out


def adapter_options(params: dict[str, str]) -> dict[str, Any]:
    raw = params.get("validation_workers", "").strip()
    return {"validation_workers": int(raw)} if raw else {}


def responder_options(params: dict[str, str]) -> dict[str, Any]:
    raw = params.get("cancellation_poll_ms", "").strip()
    return {"poll_interval_s": float(raw) / 1000.0} if raw else {}
