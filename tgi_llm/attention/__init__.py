"""Attention backends: write new K/V into the paged cache, then attend over each sequence's context."""

from __future__ import annotations

import logging
from typing import Protocol

import torch

from tgi_llm.attention.cpu_kernels import CpuAttentionKernels, cpu_attention_kernels
from tgi_llm.attention.flash import FLASH_BLOCK_SIZE_MULTIPLE, FlashPagedAttention, flash_attn_available
from tgi_llm.attention.metadata import AttentionMetadata
from tgi_llm.attention.torch_paged import TorchPagedAttention

logger = logging.getLogger(__name__)

BACKENDS = ("torch", "flash-attn")


class AttentionBackend(Protocol):
    name: str
    #: The block size must be a multiple of this (None: any block size).
    required_block_size: int | None

    def forward(
        self,
        q: torch.Tensor,  # [T, Hq, D]
        k: torch.Tensor,  # [T, Hkv, D]
        v: torch.Tensor,  # [T, Hkv, D]
        k_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D]
        v_cache: torch.Tensor,
        attn: AttentionMetadata,
        scale: float,
        window: int | None = None,  # the last `window` positions only, the query's own included
        softcap: float | None = None,  # scores -> softcap * tanh(scores / softcap)
    ) -> torch.Tensor:  # [T, Hq, D]
        ...


def preferred_block_size(device: str | torch.device, default: int = 16) -> int:
    """The KV block size the best backend for `device` can use."""
    if torch.device(device).type == "cuda" and flash_attn_available():
        return FLASH_BLOCK_SIZE_MULTIPLE
    return default


def prepare_cpu_attention(device: str | torch.device, dtype: torch.dtype) -> CpuAttentionKernels | None:
    """Build (or find in the cache) the C attention kernels now, while the model loads, so the first request
    never waits for a compiler and the log says which path this process uses (see cpu_kernels.py)."""
    if torch.device(device).type == "cpu" and dtype == torch.float32:
        return cpu_attention_kernels()
    return None


def select_attention_backend(device: str | torch.device, block_size: int, name: str | None = None,
                             cpu_bf16_prefill: bool = False) -> AttentionBackend:
    """flash-attn on CUDA when installed, else plain torch. `name` forces one ("torch", "flash-attn").
    `cpu_bf16_prefill`: on the CPU, prompt chunks with bfloat16 products (see TorchPagedAttention)."""
    device = torch.device(device)
    cpu_bf16_prefill = cpu_bf16_prefill and device.type == "cpu"
    if name is not None and name not in BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; choose one of {BACKENDS}")
    if name == "torch":
        logger.info("attention backend: torch (requested)")
        return TorchPagedAttention(cpu_bf16_prefill)
    if device.type != "cuda":
        if name == "flash-attn":
            raise ValueError(f"attention backend flash-attn needs a CUDA device, got {device}")
        logger.info("attention backend: torch (device %s)", device)
        return TorchPagedAttention(cpu_bf16_prefill)
    if not flash_attn_available():
        if name == "flash-attn":
            raise ValueError("attention backend flash-attn requested but the flash_attn package is missing")
        logger.warning("attention backend: torch on %s (flash_attn not installed; slower)", device)
        return TorchPagedAttention()
    if block_size % FLASH_BLOCK_SIZE_MULTIPLE:
        raise ValueError(
            f"KV-cache block size {block_size} does not fit flash-attn, which needs a multiple of "
            f"{FLASH_BLOCK_SIZE_MULTIPLE} for paged attention; use block size "
            f"{FLASH_BLOCK_SIZE_MULTIPLE} or attention backend 'torch'"
        )
    logger.info("attention backend: flash-attn (device %s, block size %d)", device, block_size)
    return FlashPagedAttention(block_size)


__all__ = [
    "AttentionBackend",
    "AttentionMetadata",
    "FlashPagedAttention",
    "TorchPagedAttention",
    "preferred_block_size",
    "prepare_cpu_attention",
    "select_attention_backend",
]
