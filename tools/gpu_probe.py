"""The engine on a GPU, in-process: correctness against transformers, then speed (docs/GPU.md).

    python tools/gpu_probe.py check --gguf mini.gguf
    python tools/gpu_probe.py speed --shape-dir DIR [--profile]

`check` converts a GGUF (a small one: tests/weights/test_gguf.py's `write_mini_gguf` makes one) and
runs it on CUDA with the defaults, in float32 against transformers' float32 greedy tokens, in
bfloat16 against transformers' bfloat16, with `--quantize gguf` (a start-up error), and on the CPU
(the GGUF's blocks). It also checks that prompts batched together get the tokens each gets alone.
`speed` gives a model directory's config and tokenizer random bfloat16 weights. It times one stream
against transformers' `generate` in the same process, 32 and 128 streams, and long prefills; with
`--profile` it also runs torch.profiler over batch-1 decode steps. Lent GPU machines cannot be sent
the real 98 MB GGUF, hence the small and random models.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tgi_llm import LLM  # noqa: E402

GREEDY = {"max_new_tokens": 16, "ignore_eos": True, "do_sample": False}


def random_prompts(lengths: list[int], seed: int, vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lengths]


def transformers_greedy(model_dir: Path, prompts: list[list[int]], device: str, dtype: torch.dtype) -> list[list[int]]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device).eval()
    n = GREEDY["max_new_tokens"]
    outs = []
    for p in prompts:
        out = model.generate(torch.tensor([p], device=device), do_sample=False, max_new_tokens=n, min_new_tokens=n)
        outs.append(out[0, len(p):].tolist())
    return outs


def engine_tokens(name: str, model_dir: Path, prompts: list[list[int]], **kw) -> list[list[int]] | None:
    try:
        llm = LLM(str(model_dir), **kw)
    except ValueError as exc:
        print(f"[{name}] start-up error: {exc}")
        return None
    model = llm.engine.runner.model
    together = [r.token_ids for r in llm.generate(prompts, GREEDY)]
    alone = [llm.generate([p], GREEDY)[0].token_ids for p in prompts]
    print(f"[{name}] {model.device} {model.dtype}, attention {type(model.attention_backend).__name__}; "
          f"batched == alone for {sum(a == b for a, b in zip(together, alone, strict=True))}/{len(prompts)}")
    llm.close()
    return together


def check(args: argparse.Namespace) -> None:
    from tgi_llm.weights import resolve_model_dir

    model_dir = resolve_model_dir(str(args.gguf), cache_dir=Path(tempfile.mkdtemp()), progress=False)
    prompts = random_prompts([5, 17, 40, 100, 7, 64, 23, 200], 0, 2048)
    engine_tokens("cuda, defaults", model_dir, prompts, kv_cache_memory_gb=1)
    got = engine_tokens("cuda float32", model_dir, prompts, dtype="float32", kv_cache_memory_gb=1)
    ref = transformers_greedy(model_dir, prompts, "cuda", torch.float32)
    print(f"[cuda float32] token-exact with transformers: {sum(a == b for a, b in zip(got, ref, strict=True))}/"
          f"{len(prompts)}")
    got = engine_tokens("cuda bfloat16", model_dir, prompts, dtype="bfloat16", quantize="float", kv_cache_memory_gb=1)
    ref = transformers_greedy(model_dir, prompts, "cuda", torch.bfloat16)
    same = sum(x == y for a, b in zip(got, ref, strict=True) for x, y in zip(a, b, strict=True))
    print(f"[cuda bfloat16] tokens equal to transformers': {same}/{sum(map(len, ref))}")
    engine_tokens("cuda --quantize gguf", model_dir, prompts, quantize="gguf", kv_cache_memory_gb=1)
    got = engine_tokens("cpu, the GGUF's blocks", model_dir, prompts, device="cpu", kv_cache_memory_gb=0.1)
    ref = transformers_greedy(model_dir, prompts, "cpu", torch.float32)
    print(f"[cpu] token-exact with transformers on the dequantized weights: "
          f"{sum(a == b for a, b in zip(got, ref, strict=True))}/{len(prompts)}")


def random_model(shape_dir: Path) -> Path:
    from transformers import AutoConfig, LlamaForCausalLM

    out = Path(tempfile.mkdtemp())
    torch.manual_seed(0)
    LlamaForCausalLM(AutoConfig.from_pretrained(shape_dir)).to(torch.bfloat16).save_pretrained(out)
    for f in shape_dir.iterdir():
        if f.is_file() and f.name != "config.json" and not f.name.endswith(".safetensors"):
            (out / f.name).write_bytes(f.read_bytes())
    return out


def transformers_tok_s(model_dir: Path, prompt: list[int], n: int) -> float:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).cuda().eval()
    x = torch.tensor([prompt], device="cuda")
    model.generate(x, do_sample=False, max_new_tokens=8, min_new_tokens=8)
    torch.cuda.synchronize()
    t = time.perf_counter()
    model.generate(x, do_sample=False, max_new_tokens=n, min_new_tokens=n)
    torch.cuda.synchronize()
    return n / (time.perf_counter() - t)


def speed(args: argparse.Namespace) -> None:
    model_dir = random_model(args.shape_dir)
    llm = LLM(str(model_dir), kv_cache_memory_gb=4)
    vocab = llm.tokenizer.vocab_size
    params = {"max_new_tokens": 128, "ignore_eos": True, "do_sample": False}
    prompt = random_prompts([256], 1, vocab)[0]
    llm.generate([prompt], {"max_new_tokens": 8, "ignore_eos": True})
    for rep in range(2):
        t = time.perf_counter()
        llm.generate([prompt], params)
        ours = 128 / (time.perf_counter() - t)
        theirs = transformers_tok_s(model_dir, prompt, 128)
        print(f"one stream, 256 in / 128 out (round {rep + 1}): ours {ours:.0f} tok/s, transformers {theirs:.0f}: "
              f"{ours / theirs:.2f}x")
    for n in (32, 128):
        t = time.perf_counter()
        res = llm.generate(random_prompts([256] * n, 2 + n, vocab), params)
        dt = time.perf_counter() - t
        print(f"{n} streams, 256 in / 128 out: {sum(len(r.token_ids) for r in res) / dt:.0f} tok/s")
    for n in (1500, 4000):
        t = time.perf_counter()
        llm.generate(random_prompts([n], n, vocab), {"max_new_tokens": 1})
        print(f"prefill {n} alone: {(time.perf_counter() - t) * 1e3:.0f} ms")
    steps = llm.engine.drain_step_stats()
    for batch in (1, 32):
        fwd = sorted(s.forward_s for s in steps if s.method == "decode" and s.batch_size == batch)
        if fwd:
            print(f"decode step at batch {batch}: forward p50 {fwd[len(fwd) // 2] * 1e3:.2f} ms")
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            llm.generate([prompt], {"max_new_tokens": 24, "ignore_eos": True})
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))
        print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=10))
    llm.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("check", help="correctness on CUDA and the CPU with a small GGUF")
    c.add_argument("--gguf", type=Path, required=True)
    s = sub.add_parser("speed", help="speed on CUDA with random weights in a model's shapes")
    s.add_argument("--shape-dir", type=Path, required=True, help="a model directory: its config and tokenizer")
    s.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("gpu_probe: no CUDA device")
    check(args) if args.command == "check" else speed(args)


if __name__ == "__main__":
    main()
