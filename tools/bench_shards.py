"""Tokens/s of one engine at several `--num-shard` values on this machine (gloo on the CPU).

    python tools/bench_shards.py                       # synthetic 135M-class Llama, 1 and 2 shards
    python tools/bench_shards.py --model default --shards 1 3

The default model (SmolLM2-135M: 9 heads, 3 KV heads) splits only 3 ways, so `synthetic` builds a random
Llama of the same depth, width class and vocabulary whose heads divide by 2 (hidden 512, 8 heads, 4 KV
heads, 30 layers, intermediate 1536, vocab 49152) with the default model's tokenizer. Weights are random:
tokens are meaningless, the arithmetic is the real one. Each run: greedy, EOS ignored, the model loaded
before timing; `--batch` requests of `--input-len` prompt tokens submitted at once, `--output-len` tokens
each. Output tokens/s = generated tokens / wall time; the decode step is the median forward time of
the engine's pure-decode steps (rank 0's view: plan send + forward with its collectives + gather).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import queue
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SYNTHETIC = dict(hidden_size=512, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=8,
                 num_key_value_heads=4, vocab_size=49152, max_position_embeddings=2048, rms_norm_eps=1e-5,
                 tie_word_embeddings=True, bos_token_id=1, eos_token_id=2)


def synthetic_model(dest: Path) -> Path:
    import torch
    import transformers

    from tgi_llm.weights import resolve_model_dir

    if (dest / "config.json").exists():
        return dest
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**SYNTHETIC)).eval()
    model.save_pretrained(dest)
    source = resolve_model_dir(None)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"):
        if (source / name).is_file():
            shutil.copy(source / name, dest / name)
    return dest


def run(model: str | None, num_shard: int, batch: int, input_len: int, output_len: int) -> dict:
    from tgi_llm import LLM
    from tgi_llm.events import TokenEvent

    t0 = time.perf_counter()
    llm = LLM(model, num_shard=num_shard, kv_cache_memory_gb=0.25, max_total_tokens=input_len + output_len + 8,
              max_batch_prefill_tokens=max(4096, batch * input_len))
    load_s = time.perf_counter() - t0
    try:
        params = {"max_new_tokens": output_len, "ignore_eos": True}
        prompt = list(range(100, 100 + input_len))
        llm.generate([prompt], {"max_new_tokens": 4, "ignore_eos": True})  # warm-up
        llm.engine.drain_step_stats()
        done: queue.SimpleQueue = queue.SimpleQueue()
        start = time.perf_counter()
        first: list[float] = []
        for i in range(batch):
            def on_event(e, _first=first):
                if isinstance(e, TokenEvent):
                    if e.index == 0:
                        _first.append(time.perf_counter())
                else:
                    done.put(e)
            llm.submit([p + i for p in prompt], params, on_event)
        finals = [done.get(timeout=3600) for _ in range(batch)]
        wall = time.perf_counter() - start
        steps = [s for s in llm.engine.drain_step_stats() if s.method == "decode" and s.num_prefill == 0]
        generated = sum(f.generated_tokens for f in finals)
        return {
            "num_shard": num_shard, "batch": batch, "load_s": round(load_s, 1),
            "output_tokens_per_s": round(generated / wall, 1),
            "ttft_s": round(max(first) - start, 3),
            "decode_step_ms": round(1000 * statistics.median(s.forward_s for s in steps), 2) if steps else None,
        }
    finally:
        llm.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="synthetic", help="'synthetic', 'default', or a model directory")
    ap.add_argument("--shards", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args()
    if args.model == "synthetic":
        model: str | None = str(synthetic_model(Path(tempfile.gettempdir()) / "tgi-llm-bench-synthetic-llama"))
    else:
        model = None if args.model == "default" else args.model
    results = [run(model, n, b, args.input_len, args.output_len) for b in args.batch for n in args.shards]
    machine = f"{platform.machine()}, {os.cpu_count()} CPUs"
    print(f"{args.model}: input {args.input_len}, output {args.output_len} tokens; {machine}")
    print(f"{'shards':>6} {'batch':>5} {'tok/s':>8} {'TTFT s':>7} {'decode step ms':>14} {'load s':>6}")
    for r in results:
        print(f"{r['num_shard']:>6} {r['batch']:>5} {r['output_tokens_per_s']:>8} {r['ttft_s']:>7} "
              f"{r['decode_step_ms']!s:>14} {r['load_s']:>6}")
    if args.json:
        args.json.write_text(json.dumps({"model": args.model, "machine": machine, "results": results}, indent=2))


if __name__ == "__main__":
    main()
