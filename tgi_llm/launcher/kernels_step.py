"""The CPU kernels' library, built by a child process of its own while the weights are prepared.

On a machine's first start the model's load compiled the C kernels (the linears 23 s, attention 3.5 s, the
layer stack 0.4 s on a 2-vCPU Xeon) only after the weights step had converted the GGUF (21 s) on one
core. Started beside the weights step, the compiler takes the other core; tgi_llm.native's lock makes the
model's load wait for a library this child is building instead of building it again. Later starts find
the library cached, and this child only hashes its sources (at a low priority).
Nothing depends on it: whatever fails here, the model's load builds the kernels (or serves without them)
and says why.

    python -m tgi_llm.launcher.kernels_step --log-level info [--json-output]
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence

from tgi_llm.launcher.args import count_cuda_devices
from tgi_llm.launcher.child import ChildProcess

logger = logging.getLogger("tgi_llm.launcher")

#: The child's niceness: on a warm start it must not slow the weights step or the model's load.
NICENESS = 10
STOP_TIMEOUT_S = 10.0


def start_kernels_step(log_level: str, json_output: bool) -> ChildProcess | None:
    """The child, started; None where the model will run on GPUs (these kernels are the CPU path's)."""
    if count_cuda_devices() > 0:
        return None
    command = [sys.executable, "-m", __name__, "--log-level", log_level, *(["--json-output"] if json_output else [])]
    child = ChildProcess("kernels step", command, dict(os.environ), STOP_TIMEOUT_S)
    child.start()
    # Reaped when it ends, so no zombie waits for the launcher's exit.
    threading.Thread(target=child.process.wait, name="kernels-step-reaper", daemon=True).start()
    return child


def _stop(_signum: int, _frame: object) -> None:
    # SystemExit inside subprocess.run kills the compiler, and its temporary directory is removed.
    raise SystemExit(1)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--log-level", default="info")
    parser.add_argument("--json-output", action="store_true")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _stop)
    os.nice(NICENESS)

    from tgi_llm.launcher.logs import setup_logging

    setup_logging(args.log_level, args.json_output)
    from tgi_llm.native import NativeBuildError, library_path

    try:
        library_path()
    except NativeBuildError as exc:
        logger.info("kernels step: the kernels were not built here (the model's load tries again): %s", exc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
