"""Logging as TGI sets it up: level from LOG_LEVEL (or --log-level), JSON lines with --json-output."""

from __future__ import annotations

import json
import logging
import sys
from datetime import datetime, timezone

_LEVELS = {"trace": logging.DEBUG, "debug": logging.DEBUG, "info": logging.INFO, "warn": logging.WARNING,
           "warning": logging.WARNING, "error": logging.ERROR}


def parse_level(spec: str | None) -> int:
    """TGI's LOG_LEVEL is an env-filter ("info", "text_generation_launcher=debug,warn"): the bare
    level wins; target=level directives count only when no bare level is given."""
    bare, targeted = None, None
    for part in (spec or "").split(","):
        part = part.strip().lower()
        if "=" in part:
            targeted = _LEVELS.get(part.split("=", 1)[1], targeted)
        elif part in _LEVELS:
            bare = _LEVELS[part]
    return bare or targeted or logging.INFO


class JsonFormatter(logging.Formatter):
    """One JSON object per line, shaped like TGI's tracing-subscriber JSON output."""

    def format(self, record: logging.LogRecord) -> str:
        fields = {"message": record.getMessage()}
        if record.exc_info:
            fields["exception"] = self.formatException(record.exc_info)
        return json.dumps({
            "timestamp": datetime.fromtimestamp(record.created, timezone.utc).isoformat(),
            "level": record.levelname.replace("WARNING", "WARN"),
            "fields": fields,
            "target": record.name,
        })


def json_line(message: str, level: str = "INFO", target: str = "tritonserver") -> str:
    """Wrap a line some other process printed (tritonserver's log) as the same JSON."""
    return json.dumps({
        "timestamp": datetime.now(timezone.utc).isoformat(),
        "level": level,
        "fields": {"message": message},
        "target": target,
    })


def setup_logging(level: str | None = None, json_output: bool = False) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if json_output:
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(parse_level(level))
