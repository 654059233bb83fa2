"""LoRA administration through the model's own Triton request path: the front's /v1/models,
/v1/load_lora_adapter and /v1/unload_lora_adapter send a request whose parameter `tgi_llm_lora_admin` holds
{"action": "list" | "load" | "unload", "lora_name", "lora_path"}. Its one response's `text_output` is JSON:
{"status": the HTTP status to answer with, "message", "adapters": the loaded names}.

Listing is always allowed; loading and unloading only with --lora-runtime-loading (the front does not even
route them otherwise, and a request sent straight to Triton is refused here too).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from tgi_llm.lora.spec import check_adapter_name
from tgi_llm.triton.outputs import FINISH_REASON, TEXT, Outputs

ADMIN_PARAMETER = "tgi_llm_lora_admin"


def admin_request(parameters: str | None) -> dict[str, Any] | None:
    """The admin body of a request's parameters (Triton's JSON text), or None for a generation request."""
    if not parameters or ADMIN_PARAMETER not in parameters:
        return None
    try:
        body = json.loads(json.loads(parameters).get(ADMIN_PARAMETER) or "null")
    except (ValueError, AttributeError):
        return {"action": "invalid"}
    return body if isinstance(body, dict) else {"action": "invalid"}


def answer(lora, body: dict[str, Any]) -> dict[str, Any]:
    """Carry out one admin request on the engine's LoraRegistry (None: the server takes no adapters)."""
    action = body.get("action")
    names = lora.names() if lora is not None else []
    if action == "list":
        return {"status": 200, "message": "", "adapters": names}
    if action not in ("load", "unload"):
        return {"status": 400, "message": f"unknown LoRA admin action {action!r}", "adapters": names}
    if lora is None or not lora.runtime_loading:
        return {"status": 400, "adapters": names,
                "message": "LoRA adapters can be loaded and unloaded at run time only when the server is started "
                           "with --lora-runtime-loading"}
    name = body.get("lora_name")
    try:
        check_adapter_name(name)
    except ValueError as exc:
        return {"status": 400, "message": f"`lora_name`: {exc}", "adapters": names}
    if action == "unload":
        try:
            lora.unregister(name)
        except KeyError:
            return {"status": 404, "message": f"The lora adapter '{name}' cannot be found.", "adapters": names}
        return {"status": 200, "message": f"Success: LoRA adapter '{name}' removed successfully.",
                "adapters": lora.names()}
    path = body.get("lora_path")
    if not isinstance(path, str) or not path:
        return {"status": 400, "message": "`lora_path` (a directory on the server) is required", "adapters": names}
    try:
        lora.register(name, str(Path(path).resolve()))
    except KeyError:
        return {"status": 400, "message": f"The lora adapter '{name}' has already been loaded.", "adapters": names}
    except ValueError as exc:
        return {"status": 400, "message": f"LoRA adapter '{name}': {exc}", "adapters": names}
    return {"status": 200, "message": f"Success: LoRA adapter '{name}' added successfully.", "adapters": lora.names()}


def answer_outputs(result: dict[str, Any]) -> Outputs:
    return {TEXT: np.array([json.dumps(result).encode()], dtype=np.object_),
            FINISH_REASON: np.array([b"admin"], dtype=np.object_)}
