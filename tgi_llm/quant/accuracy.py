"""How far a quantized model is from its float reference: teacher-forced top-1 agreement and mean |Δ logprob|.

Both models read the same held-out text; at every position we compare the argmax of the next-token
distribution and the log-probability each gives the text's actual next token. The text is the
docstrings of a fixed set of Python standard-library modules: English prose that ships with every
Python, so the measurement needs no download and is not the model's chat data.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
from collections.abc import Iterator
from dataclasses import dataclass

import torch

import tgi_llm.quant.linear as quant_linear
from tgi_llm.attention.metadata import AttentionMetadata
from tgi_llm.kv_cache import allocate_kv_cache, resolve_kv_cache_dtype

HELD_OUT_MODULES = ("argparse", "difflib", "pickle", "textwrap", "unittest", "logging", "heapq", "decimal",
                    "collections", "json", "csv", "shlex", "fractions", "statistics", "calendar")


def held_out_text() -> str:
    docs = []
    for name in HELD_OUT_MODULES:
        module = importlib.import_module(name)
        docs.append(inspect.getdoc(module) or "")
        docs.extend(inspect.getdoc(obj) or "" for _, obj in sorted(vars(module).items())
                    if inspect.isclass(obj) and getattr(obj, "__module__", "") == name)
    return "\n\n".join(d for d in docs if len(d) > 200)


def held_out_sequences(tokenizer, count: int, length: int) -> list[list[int]]:
    ids = tokenizer(held_out_text(), add_special_tokens=False)["input_ids"]
    if len(ids) < count * length:
        raise ValueError(f"held-out text has {len(ids)} tokens, fewer than {count} x {length}")
    stride = len(ids) // count
    return [ids[i * stride:i * stride + length] for i in range(count)]


@contextlib.contextmanager
def kernels_at_every_length() -> Iterator[None]:
    """Send every quantized linear through the decode kernel (not the GEMM kernel that 10 or more rows take,
    14 for 8-bit codes), so the comparison covers the decode kernel's factored arithmetic (scale and min
    applied per group); the GEMM multiplies the exactly dequantized weights, like the float reference."""
    saved = quant_linear.GEMM_MIN_TOKENS, quant_linear.Q8_GEMM_MIN_TOKENS
    quant_linear.GEMM_MIN_TOKENS = quant_linear.Q8_GEMM_MIN_TOKENS = 1 << 30
    try:
        yield
    finally:
        quant_linear.GEMM_MIN_TOKENS, quant_linear.Q8_GEMM_MIN_TOKENS = saved


def sequence_logits(model, config, ids: list[int], block_size: int = 16) -> torch.Tensor:
    """float32 logits [len(ids), V] of one sequence in one prefill, with a KV cache of its own."""
    blocks = -(-len(ids) // block_size)
    # the cache type a server holds by default (--kv-cache-dtype auto), so both models are measured as served
    caches = allocate_kv_cache(config, blocks, block_size, resolve_kv_cache_dtype(None, model.device, model.dtype))
    n = len(ids)
    attn = AttentionMetadata(
        slot_mapping=torch.arange(n, dtype=torch.int64), query_start_loc=torch.tensor([0, n], dtype=torch.int32),
        seq_lens=torch.tensor([n], dtype=torch.int32), block_tables=torch.arange(blocks, dtype=torch.int32)[None],
        query_lens_cpu=[n], seq_lens_cpu=[n], block_size=block_size)
    with torch.inference_mode():
        return model.compute_logits(model(torch.tensor(ids), torch.arange(n), caches, attn))


@dataclass(frozen=True)
class Agreement:
    positions: int
    top1_agreement: float  # share of positions where both argmaxes are the same token
    mean_abs_logprob_diff: float  # of the text's actual next token, natural log

    def to_dict(self) -> dict:
        return {"positions": self.positions, "top1_agreement": self.top1_agreement,
                "mean_abs_logprob_diff": self.mean_abs_logprob_diff}


def compare(reference_logits: list[torch.Tensor], logits: list[torch.Tensor], sequences: list[list[int]]) -> Agreement:
    same, diffs = 0, []
    for ref, got, ids in zip(reference_logits, logits, sequences, strict=True):
        ref, got = ref[:-1].log_softmax(-1), got[:-1].log_softmax(-1)  # position t predicts token t + 1
        nxt = torch.tensor(ids[1:])[:, None]
        same += int((ref.argmax(-1) == got.argmax(-1)).sum())
        diffs.append((ref.gather(1, nxt) - got.gather(1, nxt)).abs().flatten())
    d = torch.cat(diffs)
    return Agreement(d.numel(), same / d.numel(), float(d.mean()))
