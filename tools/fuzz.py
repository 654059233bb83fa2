"""A longer, random run of the CI fuzzer (tests/fuzz): hostile requests on every API of a launched server.

    .venv/bin/python tools/fuzz.py --examples 1000          # 1,000 random cases per API, a fresh seed each run
    .venv/bin/python tools/fuzz.py --examples 200 --seed 7  # repeatable

A failure prints the case as a reproducer (route and body, or the gRPC tensors) and hypothesis's
@reproduce_failure blob. The CI run is the same module with 30 derandomized cases per API.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--examples", type=int, default=500, help="cases per API (default 500)")
    ap.add_argument("--seed", type=int, default=None, help="a fixed seed (default: random)")
    ap.add_argument("pytest_args", nargs="*", help="passed to pytest, e.g. -k grpc")
    args = ap.parse_args(argv)
    env = dict(os.environ, FUZZ_EXAMPLES=str(args.examples), FUZZ_RANDOM="1")
    seed = [f"--hypothesis-seed={args.seed}"] if args.seed is not None else []
    command = [sys.executable, "-m", "pytest", "-x", "-q", str(ROOT / "tests" / "fuzz"), *seed, *args.pytest_args]
    return subprocess.call(command, cwd=ROOT, env=env)


if __name__ == "__main__":
    sys.exit(main())
