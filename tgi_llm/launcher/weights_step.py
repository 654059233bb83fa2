"""Weight preparation (hub download or GGUF conversion) in a child process of its own.

Resolving a model imports torch, safetensors and gguf: ~230 MB that the launcher, a supervisor that lives
as long as the server, would otherwise hold for nothing (Python returns little of it to the OS). The
child logs as the launcher does (same level, same --json-output), shows its progress on the inherited
stderr, and answers on stdout with one JSON line: {"model_dir": ...} or {"error": ...}.

    python -m tgi_llm.launcher.weights_step [MODEL_ID] --log-level info [--json-output]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path


class WeightsError(RuntimeError):
    """The weights could not be prepared; the message says why."""


def prepare_in_child(target: str | None, log_level: str, json_output: bool) -> Path:
    """The local model directory for `target` (None: the default model), prepared by a child process."""
    command = [sys.executable, "-m", __name__, *([target] if target else []), "--log-level", log_level]
    if json_output:
        command.append("--json-output")
    done = subprocess.run(command, stdout=subprocess.PIPE, check=False)
    lines = done.stdout.decode("utf-8", errors="replace").strip().splitlines()
    try:
        answer = json.loads(lines[-1]) if lines else {}
    except ValueError:
        answer = {}
    if "model_dir" in answer and done.returncode == 0:
        return Path(answer["model_dir"])
    raise WeightsError(answer.get("error") or f"the weights step exited with {done.returncode} and no answer")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_id", nargs="?", default=None)
    parser.add_argument("--log-level", default="info")
    parser.add_argument("--json-output", action="store_true")
    args = parser.parse_args(argv)

    from tgi_llm.launcher.logs import setup_logging

    setup_logging(args.log_level, args.json_output)
    try:
        from tgi_llm.weights import resolve_model_dir

        answer = {"model_dir": str(resolve_model_dir(args.model_id, progress=True))}
    except Exception as exc:  # reported to the launcher, which names the error kind
        answer = {"error": str(exc) or repr(exc)}
    print(json.dumps(answer), flush=True)
    return 0 if "model_dir" in answer else 1


if __name__ == "__main__":
    raise SystemExit(main())
