"""flash-attn 2 paged attention (CUDA only): one varlen kernel call for the whole mixed batch.

flash_attn_varlen_func reads K/V straight from the paged cache through `block_table`; with
causal=True and seqlen_k > seqlen_q the causal mask is aligned to the bottom-right, which is
exactly "new tokens come after the cached prefix". Paged KV needs a block size divisible by 256.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tgi_llm.attention.metadata import AttentionMetadata
from tgi_llm.kv_cache import write_kv_cache

FLASH_BLOCK_SIZE_MULTIPLE = 256


def flash_attn_available() -> bool:
    try:
        import flash_attn  # noqa: F401
    except ImportError:
        return False
    return True


class FlashPagedAttention:
    name = "flash-attn"
    required_block_size: int | None = FLASH_BLOCK_SIZE_MULTIPLE

    def __init__(self, block_size: int) -> None:
        if block_size % FLASH_BLOCK_SIZE_MULTIPLE:
            raise ValueError(
                f"flash-attn paged attention needs a KV-cache block size that is a multiple of "
                f"{FLASH_BLOCK_SIZE_MULTIPLE}, got {block_size}"
            )
        from flash_attn import flash_attn_varlen_func

        self._varlen = flash_attn_varlen_func
        self.block_size = block_size

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
        write_kv_cache(k, v, k_cache, v_cache, attn.slot_mapping)
        cu_seqlens_k = F.pad(attn.seq_lens.cumsum(0, dtype=torch.int32), (1, 0))
        return self._varlen(
            q,
            k_cache,
            v_cache,
            cu_seqlens_q=attn.query_start_loc.to(torch.int32),
            cu_seqlens_k=cu_seqlens_k,
            max_seqlen_q=attn.max_query_len,
            max_seqlen_k=attn.max_seq_len,
            softmax_scale=scale,
            causal=True,
            window_size=(-1, -1) if window is None else (window - 1, 0),
            softcap=0.0 if softcap is None else softcap,
            block_table=attn.block_tables.to(torch.int32),
        )
