"""Paged attention in plain torch: the CPU backend and the reference the others are checked against.

On the CPU (float32), decode sequences (one new token each) go through the C kernel of cpu_kernels.py,
which reads K/V in place through the block tables; prompt chunks too where its prefill kernel measured
faster than SDPA at load (all the step's chunks in one call, each over its whole context read in place).
Elsewhere (or without a compiler): decodes through one batched SDPA call over K/V gathered from their
block tables and padded to the longest, each prompt chunk through its own SDPA call. Layers with a sliding
window that some sequence has outgrown, or with soft-capped scores, take a per-sequence path that gathers
only the window's blocks.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tgi_llm.attention.cpu_kernels import PrefillSequence, cpu_attention_kernels
from tgi_llm.attention.metadata import AttentionMetadata
from tgi_llm.kv_cache import as_cached, gather_kv, write_kv_cache


class TorchPagedAttention:
    name = "torch"
    #: Any block size works.
    required_block_size: int | None = None

    def __init__(self, bf16_prefill: bool = False) -> None:
        #: Prompt chunks through the kernel's bfloat16 products (a model whose linears run in bfloat16).
        self.bf16_prefill = bf16_prefill

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        attn: AttentionMetadata,
        scale: float,
        window: int | None = None,
        softcap: float | None = None,
    ) -> torch.Tensor:
        """`window`: each query sees the last `window` positions, itself included (None: all before it).
        `softcap`: scores become softcap * tanh(scores / softcap) before the softmax."""
        write_kv_cache(k, v, k_cache, v_cache, attn.slot_mapping)
        outside_window = window is not None and attn.max_seq_len > window
        all_decodes = attn.is_pure_decode and q.shape[0] == attn.num_seqs  # the common step
        # soft-capped scores: the decode kernel caps them, nothing else here does
        if all_decodes and not outside_window and (softcap is None or _decode_kernels(q, k_cache) is not None):
            return self._decode(q, k_cache, v_cache, attn.block_tables, attn.seq_lens, attn.seq_lens_cpu, scale,
                                softcap)
        if softcap is not None or outside_window:
            return windowed_attention(q, k_cache, v_cache, attn, scale, window, softcap)

        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        kernels = cpu_attention_kernels() if q.device.type == "cpu" else None
        if kernels is not None and not (kernels.prefill_wins and kernels.supports_prefill(q, k_cache)
                                        and k_cache.is_contiguous()):
            kernels = None  # decodes still take the kernel, in _decode
        decode_seqs: list[int] = []
        decode_tokens: list[int] = []
        prompts: list[PrefillSequence] = []  # prompt chunks: one kernel call for all of them
        start = 0
        for i, (q_len, seq_len) in enumerate(zip(attn.query_lens_cpu, attn.seq_lens_cpu, strict=True)):
            if q_len == 1:
                decode_seqs.append(i)
                decode_tokens.append(start)
            elif q_len > 1 and kernels is not None:  # K/V in place, the new tokens' already written
                prompts.append(PrefillSequence(start, q_len, seq_len, i))
            elif q_len > 1:
                out[start : start + q_len] = self._prefill(
                    q[start : start + q_len],
                    k[start : start + q_len],
                    v[start : start + q_len],
                    k_cache,
                    v_cache,
                    attn.block_tables[i : i + 1],
                    seq_len,
                    scale,
                )
            start += q_len
        if prompts:
            kernels.prefill(q, out, k_cache, v_cache, attn.block_tables, prompts, scale, bf16=self.bf16_prefill)
        if decode_seqs:
            seq_idx = torch.tensor(decode_seqs, device=q.device)
            tok_idx = torch.tensor(decode_tokens, device=q.device)
            out[tok_idx] = self._decode(
                q[tok_idx],
                k_cache,
                v_cache,
                attn.block_tables[seq_idx],
                attn.seq_lens[seq_idx],
                [attn.seq_lens_cpu[i] for i in decode_seqs],
                scale,
            )
        return out

    @staticmethod
    def _decode(
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        block_tables: torch.Tensor,
        seq_lens: torch.Tensor,
        seq_lens_cpu: list[int],
        scale: float,
        softcap: float | None = None,  # only where _decode_kernels serves q
    ) -> torch.Tensor:
        """q: [B, Hq, D], one query per sequence -> [B, Hq, D]."""
        kernels = _decode_kernels(q, k_cache)
        if kernels is not None:  # reads K/V in place, no gathered copy (cpu_kernels.py)
            return kernels.decode(q, k_cache, v_cache, block_tables, seq_lens, max(seq_lens_cpu), scale, softcap)
        batch, num_heads, dim = q.shape
        block_size, kv_heads = k_cache.shape[1], k_cache.shape[2]
        num_blocks = -(-max(seq_lens_cpu) // block_size)
        keys = gather_kv(k_cache, block_tables, num_blocks, q.dtype).transpose(1, 2)  # [B, Hkv, L, D]
        values = gather_kv(v_cache, block_tables, num_blocks, q.dtype).transpose(1, 2)
        # GQA without repeating K/V: the G query heads sharing a KV head act as G queries of it.
        queries = q.view(batch, kv_heads, num_heads // kv_heads, dim)
        positions = torch.arange(keys.shape[2], device=q.device)
        mask = (positions[None, :] < seq_lens.to(q.device)[:, None])[:, None, None, :]  # [B, 1, 1, L]
        out = F.scaled_dot_product_attention(queries, keys, values, attn_mask=mask, scale=scale)
        return out.reshape(batch, num_heads, dim)

    @staticmethod
    def _prefill(
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        block_table: torch.Tensor,
        seq_len: int,
        scale: float,
    ) -> torch.Tensor:
        """One sequence: q/k/v [Lq, H, D] for its new tokens, `seq_len - Lq` tokens already cached."""
        q_len = q.shape[0]
        cached = seq_len - q_len
        # Contiguous [1, H, L, D]: SDPA's CPU flash kernel is ~5x slower on the transposed views.
        queries = q.transpose(0, 1).contiguous().unsqueeze(0)
        if cached == 0:  # nothing cached before: the new K/V (as the cache holds them) are the whole context
            keys, values, mask, causal = as_cached(k, k_cache), as_cached(v, v_cache), None, True
        else:
            num_blocks = -(-seq_len // k_cache.shape[1])
            keys = gather_kv(k_cache, block_table, num_blocks, q.dtype)[0, :seq_len]
            values = gather_kv(v_cache, block_table, num_blocks, q.dtype)[0, :seq_len]
            # causal, offset by the cached prefix: query i sits at absolute position cached + i
            rows = torch.arange(q_len, device=q.device)[:, None] + cached
            mask, causal = torch.arange(seq_len, device=q.device)[None, :] <= rows, False
        out = F.scaled_dot_product_attention(
            queries,
            keys.transpose(0, 1).contiguous().unsqueeze(0),
            values.transpose(0, 1).contiguous().unsqueeze(0),
            attn_mask=mask,
            is_causal=causal,
            scale=scale,
            enable_gqa=True,
        )
        return out[0].transpose(0, 1)


def _decode_kernels(q: torch.Tensor, k_cache: torch.Tensor):
    """The C decode kernel where it serves these queries and this cache (None: it does not)."""
    kernels = cpu_attention_kernels() if q.device.type == "cpu" else None
    return kernels if kernels is not None and kernels.supports(q, k_cache) and k_cache.is_contiguous() else None


def windowed_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, attn: AttentionMetadata,
                       scale: float, window: int | None, softcap: float | None) -> torch.Tensor:
    """Attention one sequence at a time, in transformers' eager order (scale, soft-cap, mask, float32 softmax),
    over the blocks that hold the keys some query of the sequence can see."""
    out = torch.empty_like(q)
    heads, dim = q.shape[1], q.shape[2]
    block_size, kv_heads = k_cache.shape[1], k_cache.shape[2]
    start = 0
    for i, (q_len, seq_len) in enumerate(zip(attn.query_lens_cpu, attn.seq_lens_cpu, strict=True)):
        first_query = seq_len - q_len
        first_key = 0 if window is None else max(0, first_query - window + 1)
        first_block = first_key // block_size
        table = attn.block_tables[i : i + 1, first_block:]
        offset = first_block * block_size
        blocks = -(-(seq_len - offset) // block_size)
        keys = gather_kv(k_cache, table, blocks, q.dtype)[0, : seq_len - offset].transpose(0, 1)  # [Hkv, L, D]
        values = gather_kv(v_cache, table, blocks, q.dtype)[0, : seq_len - offset].transpose(0, 1)
        queries = q[start : start + q_len].view(q_len, kv_heads, heads // kv_heads, dim).permute(1, 2, 0, 3)
        scores = torch.matmul(queries, keys.transpose(-1, -2)[:, None]) * scale  # [Hkv, G, Lq, L]
        if softcap is not None:
            scores = torch.tanh(scores / softcap) * softcap
        query_pos = torch.arange(first_query, seq_len, device=q.device)[:, None]
        key_pos = torch.arange(offset, seq_len, device=q.device)[None, :]
        visible = key_pos <= query_pos
        if window is not None:
            visible &= key_pos > query_pos - window
        scores = scores.masked_fill(~visible, float("-inf"))
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        o = torch.matmul(probs, values[:, None])  # [Hkv, G, Lq, D]
        out[start : start + q_len] = o.permute(2, 0, 1, 3).reshape(q_len, heads, dim)
        start += q_len
    return out
