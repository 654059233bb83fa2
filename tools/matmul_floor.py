"""The matmul floor of a decode step (tgi_llm/bench/floor.py: the model's linears alone, at the decode batch
shapes) at several batch sizes, next to plain `F.linear` (MKL) on the same weights, interleaved.

    python tools/matmul_floor.py --batch-sizes 1 8 16 32 64
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tgi_llm.bench.floor import MatmulFloor  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-id", default=None, help="default: SmolLM2-135M-Instruct")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 16, 32, 64])
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--threads", type=int, default=None, help="default: torch's (all cores)")
    ap.add_argument("--quantize", default=None, help="as the launcher's (default: the GGUF's own blocks)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    from tgi_llm.models.loader import load_model
    from tgi_llm.quant.modes import parse_quantize
    from tgi_llm.weights import resolve_model_dir

    model, _ = load_model(resolve_model_dir(args.model_id), quantization=parse_quantize(args.quantize))
    print(f"threads {torch.get_num_threads()}, weights {model.quantization.describe()}, "
          f"oneDNN-packed LM head: {model.lm_head_packed is not None}")
    print("| batch | floor ms | GFLOP/s | weight GB/s | plain F.linear ms | plain / floor |")
    print("|---|---|---|---|---|---|")
    for batch in args.batch_sizes:
        floor, plain = MatmulFloor(model, batch), MatmulFloor(model, batch, plain=True)
        times: dict[str, list[float]] = {"floor": [], "plain": []}
        floor.run(), plain.run()
        for _ in range(args.reps):  # interleaved, so both see the same machine
            times["floor"].append(floor.run())
            times["plain"].append(plain.run())
        f, p = statistics.median(times["floor"]), statistics.median(times["plain"])
        print(f"| {batch} | {f * 1e3:.1f} | {floor.flops / f / 1e9:.0f} | {floor.weight_bytes / f / 1e9:.1f} "
              f"| {p * 1e3:.1f} | {p / f:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
