"""`--lora-adapters` (env LORA_ADAPTERS): TGI's comma-separated `id=path` list (a bare path is its own id)."""

from __future__ import annotations

import re

#: Adapter names as requests send them (`adapter_id`, OpenAI's `model`, Triton's `lora_name`).
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,127}$")


def check_adapter_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"LoRA adapter name {name!r} must be 1-128 characters: letters, digits and ._:/@+- "
                         "(starting with a letter or digit)")
    return name


def parse_lora_adapters(text: str | None) -> dict[str, str]:
    """{adapter id: path} in the order given; a repeated id is an error naming it."""
    out: dict[str, str] = {}
    for item in (text or "").split(","):
        item = item.strip()
        if not item:
            continue
        name, sep, path = item.partition("=")
        name, path = (name.strip(), path.strip()) if sep else (item, item)
        if not path:
            raise ValueError(f"`lora_adapters` entry {item!r} has no path (id=path)")
        check_adapter_name(name)
        if name in out:
            raise ValueError(f"`lora_adapters` names adapter {name!r} twice")
        out[name] = path
    return out
