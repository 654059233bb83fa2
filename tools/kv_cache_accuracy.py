"""Each --kv-cache-dtype against the float32 cache on held-out text (tgi_llm/kv_accuracy.py): teacher-forced
top-1 agreement and mean |Δ logprob| of the actual next token, at several context lengths.

    python tools/kv_cache_accuracy.py --lengths 512 4096 16000 --kv-cache-dtype bfloat16 float16 int8

The model is loaded as the server loads it (the default model: its Q4_1 GGUF). Each length takes as many
sequences as the held-out text holds (~16,000 tokens), at most --sequences.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tgi_llm.kv_cache import KV_CACHE_TYPES  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    from transformers import AutoTokenizer

    from tgi_llm.kv_accuracy import agreement, sequence_stats
    from tgi_llm.models.loader import load_model
    from tgi_llm.quant.accuracy import held_out_sequences
    from tgi_llm.weights import resolve_model_dir

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-id", default=None, help="default: SmolLM2-135M-Instruct (its Q4_1 GGUF)")
    ap.add_argument("--lengths", type=int, nargs="+", default=[512, 4096, 16000])
    ap.add_argument("--kv-cache-dtype", nargs="+", default=["bfloat16", "float16", "int8"],
                    choices=[name for name in KV_CACHE_TYPES if name != "float32"])
    ap.add_argument("--sequences", type=int, default=8)
    ap.add_argument("--json", default=None, help="write the results here too")
    args = ap.parse_args(argv)

    model_dir = resolve_model_dir(args.model_id, progress=False)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model, _ = load_model(model_dir)
    results = []
    print("| KV cache | context | positions | top-1 agreement | mean abs logprob diff |\n|---|---|---|---|---|")
    for length in args.lengths:
        available = len(tokenizer(_text(), add_special_tokens=False)["input_ids"]) // length
        seqs = held_out_sequences(tokenizer, min(args.sequences, available), length)
        reference = [sequence_stats(model, s, torch.float32) for s in seqs]
        for name in args.kv_cache_dtype:
            r = agreement(reference, [sequence_stats(model, s, KV_CACHE_TYPES[name]) for s in seqs])
            results.append({"kv_cache_dtype": name, "length": length, **r.to_dict()})
            print(f"| {name} | {length} | {r.positions} | {100 * r.top1_agreement:.2f}% "
                  f"| {r.mean_abs_logprob_diff:.4f} |", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"model": str(model_dir), "torch": torch.__version__,
                                               "results": results}, indent=1) + "\n", encoding="utf-8")
    return 0


def _text() -> str:
    from tgi_llm.quant.accuracy import held_out_text

    return held_out_text()


if __name__ == "__main__":
    raise SystemExit(main())
