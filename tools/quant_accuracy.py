"""Each --quantize mode against the float reference on held-out text (tgi_llm/quant/accuracy.py):
teacher-forced top-1 agreement and mean |Δ logprob| of the actual next token.

    python tools/quant_accuracy.py --modes gguf int8 int4 --sequences 16 --length 512
    python tools/quant_accuracy.py --modes float --dtype bfloat16   # --dtype bfloat16 against float32

The reference is the same checkpoint as floats (for a GGUF: its blocks dequantized, exactly the
converted directory's weights). Quantized linears run through the C kernels at every length.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> int:
    from transformers import AutoTokenizer

    from tgi_llm.models.loader import load_model
    from tgi_llm.quant.accuracy import compare, held_out_sequences, kernels_at_every_length, sequence_logits
    from tgi_llm.quant.modes import Quantization, parse_quantize
    from tgi_llm.weights import resolve_model_dir

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-id", default=None, help="default: SmolLM2-135M-Instruct (its Q4_1 GGUF)")
    ap.add_argument("--modes", nargs="+", default=["gguf", "int8", "int4"])
    ap.add_argument("--group-size", type=int, default=None)
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                    help="what the modes run in (bfloat16: with --modes float)")
    ap.add_argument("--sequences", type=int, default=16)
    ap.add_argument("--length", type=int, default=512)
    ap.add_argument("--json", default=None, help="write the results here too")
    args = ap.parse_args(argv)

    model_dir = resolve_model_dir(args.model_id, progress=False)
    seqs = held_out_sequences(AutoTokenizer.from_pretrained(model_dir), args.sequences, args.length)
    ref_model, config = load_model(model_dir, quantization=Quantization("float"))
    reference = [sequence_logits(ref_model, config, s) for s in seqs]
    del ref_model
    results = {}
    print("| mode | positions | top-1 agreement | mean abs logprob diff |\n|---|---|---|---|")
    for mode in args.modes:
        model, _ = load_model(model_dir, dtype=getattr(torch, args.dtype),
                              quantization=parse_quantize(mode, args.group_size))
        with kernels_at_every_length():
            got = [sequence_logits(model, config, s) for s in seqs]
        r = compare(reference, got, seqs)
        name = model.quantization.describe() + ("" if args.dtype == "float32" else f", {args.dtype}")
        results[name] = r.to_dict()
        print(f"| {name} | {r.positions} | {100 * r.top1_agreement:.2f}% "
              f"| {r.mean_abs_logprob_diff:.4f} |", flush=True)
        del model
    if args.json:
        Path(args.json).write_text(json.dumps({"model": str(model_dir), "torch": torch.__version__,
                                               "results": results}, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
