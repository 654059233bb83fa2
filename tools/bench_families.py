"""One-stream decode speed of each native family against a Llama of the same shapes, in-process, one run.

Random checkpoints at SmolLM2-135M's shapes (hidden 576, 30 layers, 9 heads, 3 KV heads, vocabulary
49,152; the family's own parts on top) are written once under ~/.cache/tgi_llm/bench/families, then each
serves the same prompt greedily, interleaved over rounds; the table gives ms per token and the ratio to
Llama's (median of rounds; >1 = slower than Llama). The mixtures of experts have Llama's active parameters
per token (top-2 of 8 experts, each half Llama's MLP), so theirs is a ratio per active parameter.

    python tools/bench_families.py --families llama qwen3 gemma2 --tokens 64 --rounds 3
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tgi_llm import LLM  # noqa: E402
from tgi_llm.weights import resolve_model_dir  # noqa: E402

SHAPES = dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
              num_key_value_heads=3, head_dim=64, vocab_size=49152, max_position_embeddings=2048,
              tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=0)
#: model_type and its own config entries, by family name.
FAMILIES = {
    "llama": ("llama", {}),
    "mistral": ("mistral", {"sliding_window": 4096}),
    "qwen3": ("qwen3", {}),
    "gemma2": ("gemma2", {"query_pre_attn_scalar": 64, "sliding_window": 4096}),
    "gemma3": ("gemma3_text", {"query_pre_attn_scalar": 64, "sliding_window": 512}),
    "phi3": ("phi3", {}),
    "phi4-mini": ("phi3", {"partial_rotary_factor": 0.75}),  # rope on 3/4 of each head
    "granite": ("granite", {"embedding_multiplier": 12.0, "residual_multiplier": 0.22, "attention_multiplier": 0.015,
                            "logits_scaling": 8.0}),
    "olmo2": ("olmo2", {}),
    "smollm3": ("smollm3", {}),
    "gemma": ("gemma", {}),
    # 8 experts of half Llama's MLP, top-2: the same active parameters per token as the Llama they are timed against
    "mixtral": ("mixtral", {"num_local_experts": 8, "num_experts_per_tok": 2, "intermediate_size": 768,
                            "sliding_window": None}),
    "qwen3_moe": ("qwen3_moe", {"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 768,
                                "norm_topk_prob": True}),
    "starcoder2 (transformers)": ("starcoder2", {"sliding_window": 4096}),  # no native family: transformers' code
}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def checkpoint(name: str, root: Path) -> Path:
    path = root / name.split()[0]
    if (path / "config.json").is_file():
        return path
    import transformers

    model_type, extra = FAMILIES[name]
    torch.manual_seed(0)
    config = transformers.AutoConfig.for_model(model_type, **{**SHAPES, **extra})
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(path)
    tokenizer_dir = resolve_model_dir(None)
    for file in TOKENIZER_FILES:
        if (tokenizer_dir / file).is_file():
            shutil.copy(tokenizer_dir / file, path / file)
    return path


def ms_per_token(llm: LLM, prompt: list[int], tokens: int) -> float:
    params = {"max_new_tokens": tokens, "ignore_eos": True}
    llm.generate([prompt], {"max_new_tokens": 2, "ignore_eos": True})  # warm: first steps check the C stack
    start = time.perf_counter()
    llm.generate([prompt], params)
    return (time.perf_counter() - start) * 1000 / tokens


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--families", nargs="+", default=list(FAMILIES), choices=list(FAMILIES))
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=128, help="prompt tokens")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--root", type=Path, default=Path.home() / ".cache/tgi_llm/bench/families")
    args = ap.parse_args(argv)
    names = ["llama", *(f for f in args.families if f != "llama")]
    dirs = {name: checkpoint(name, args.root) for name in names}
    prompt = list(range(1000, 1000 + args.prompt))
    times: dict[str, list[float]] = {name: [] for name in names}
    llms = {name: LLM(str(dirs[name]), kv_cache_memory_gb=0.2) for name in names}
    try:
        for _ in range(args.rounds):
            for name in names:
                times[name].append(ms_per_token(llms[name], prompt, args.tokens))
    finally:
        for llm in llms.values():
            llm.close()
    base = statistics.median(times["llama"])
    print("| family | ms/token | / llama |\n| --- | --- | --- |")
    for name in names:
        ms = statistics.median(times[name])
        print(f"| {name} | {ms:.2f} | {ms / base:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
