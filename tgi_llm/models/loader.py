"""load_model: a checkpoint directory to a ready CausalLM, its weights in the format and dtype asked for."""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from tgi_llm.attention import AttentionBackend, prepare_cpu_attention
from tgi_llm.hugepages import huge_page_bytes, weights_in_huge_pages
from tgi_llm.models.backed_config import FAMILY as BACKED
from tgi_llm.models.config import ModelConfig
from tgi_llm.models.decoder import CausalLM
from tgi_llm.models.layer_stack import layer_stack_library
from tgi_llm.models.layers.linear import float_linear_kernels
from tgi_llm.models.registry import read_config_dir
from tgi_llm.models.rope_override import RopeOverride
from tgi_llm.models.transformers_backed import load_backed_model
from tgi_llm.models.weight_loader import WeightLoader
from tgi_llm.quant.linear import BF16_GEMM_MIN_TOKENS, QuantLinear
from tgi_llm.quant.modes import Quantization
from tgi_llm.weights.safetensors_loader import NO_SHARD, Shard

logger = logging.getLogger(__name__)


def describe_gguf(tensors) -> str:
    counts: dict[str, int] = {}
    for kind in tensors.types.values():
        counts[kind] = counts.get(kind, 0) + 1
    return ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))


def load_model(
    model_dir: str | Path,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    attention_backend: AttentionBackend | None = None,
    shard: Shard = NO_SHARD,
    quantization: Quantization | None = None,
    rope_override: RopeOverride | None = None,
) -> tuple[CausalLM, ModelConfig]:
    """Build the model from a HF directory. With no backend given, one is picked on the first forward
    (it depends on the KV block size, which the runner decides). `quantization` None: a directory
    converted from a GGUF runs the GGUF's blocks on the CPU in float32 and floats elsewhere, float
    checkpoints run in `dtype` (quant/modes.py).

    bfloat16 on the CPU, one shard, where the C kernels serve float linears: the decoder layers' weights are
    held in bfloat16 and multiplied by the kernels' bfloat16 GEMM (activations rounded to bfloat16 at each
    matmul, products summed in float32; AVX512-BF16 where the CPU has it), the LM head too where the
    vocabulary fills whole panels, and prompt attention takes bfloat16 products on AVX512-BF16 CPUs;
    everything else (norms, rope, the softmax, decode attention, the KV cache) is float32. The model then
    reports float32 (`model.dtype`).
    Quantized weights in bfloat16 (a GGUF, or --quantize named) keep their codes: decode rows read them with
    float32 products, and from BF16_GEMM_MIN_TOKENS rows the panel GEMM rounds each dequantized chunk to
    bfloat16 as the bfloat16 weights' GEMM holds them (bit for bit its products) at a quarter of the bytes.
    Except a GGUF left to the default on an AMX CPU: its tiles multiply bfloat16 weights in place.
    torch's own bfloat16 CPU linears take no BF16 instructions on AMD CPUs (docs/PERFORMANCE.md).
    `rope_override` (--rope-scaling / --rope-factor) replaces the rope scaling config.json states."""
    config = read_config_dir(model_dir)
    if config.family == BACKED:
        if (quantization is not None and quantization.mode != "float") or shard.world_size > 1 or rope_override:
            raise ValueError(f"{config.model_type} runs through transformers' modeling code: float weights on one "
                             "shard only, with the config's own rope (no --quantize, no --num-shard, no "
                             "--rope-scaling / --rope-factor)")
        return load_backed_model(model_dir, config, dtype, device), config
    if rope_override is not None:
        config = rope_override.apply(config)
    cpu_bf16 = (torch.device(device).type == "cpu" and dtype == torch.bfloat16 and shard.world_size == 1
                and (kernels := float_linear_kernels(torch.float32)) is not None)
    codes_in_bf16 = cpu_bf16 and (quantization is not None or not kernels.amx)  # where quantized weights stay
    kernels_apply = torch.device(device).type == "cpu" and (dtype == torch.float32 or codes_in_bf16)
    weights = WeightLoader(model_dir, config, quantization, shard, kernels_apply)
    bf16_weights = cpu_bf16 and not weights.quantized
    bf16_codes = codes_in_bf16 and weights.quantized
    compute_dtype = torch.float32 if bf16_weights or bf16_codes else dtype
    if weights.quantized and not kernels_apply:
        raise ValueError(f"quantized weights (--quantize {weights.quantization.mode}) run on the CPU's C kernels "
                         "with float32 activations (bfloat16 products with one shard); got device "
                         f"{device} and --dtype {str(dtype).removeprefix('torch.')} "
                         "(use --quantize float for float weights in that dtype)")
    with weights_in_huge_pages() as arena:  # QuantLinear and prepare_cpu_linears place what the kernels stream
        model = CausalLM(config, weights, shard, attention_backend=attention_backend)
        model = model.to(device=device, dtype=compute_dtype).eval()
        if weights.quantized:
            # safetensors hands out views of its file mapping; a norm weight kept as one keeps the whole file
            # resident (540 MB of float32 pages for SmolLM2 that quantizing read once). Own copies instead.
            for p in model.parameters():
                p.data = p.data.clone()
        weight_dtype = torch.bfloat16 if bf16_weights else torch.float32
        if model.device.type == "cpu" and (chosen := model.prepare_cpu_linears(weight_dtype)):
            logger.info(chosen)
        if bf16_codes:  # the decoder layers' and the head's codes; the embedding's lookup stays exact
            for m in [*model.layers.modules(), model.lm_head_quant]:
                if isinstance(m, QuantLinear) and m.qweight.order == "panel":
                    m.take_bf16_products(BF16_GEMM_MIN_TOKENS)
    if arena is not None and arena.placed_bytes:
        logger.info("weights in huge pages: %.1f MB placed, %.1f MB of the process backed by them",
                    arena.placed_bytes / 1e6, huge_page_bytes() / 1e6)
    attention = prepare_cpu_attention(device, compute_dtype)
    model.bf16_prefill_attention = ((bf16_weights or bf16_codes) and attention is not None
                                    and attention.bf16_prefill_address is not None)
    if (weights.quantized or model.float_kernels is not None) and model.device.type == "cpu":
        layer_stack_library()  # loaded now, not on the first request's first token
    logger.info(
        "loaded %s (%s, served by the native %s family; %d layers, hidden %d) as %s on %s, weights %s",
        model_dir,
        config.model_type,
        config.family,
        config.num_hidden_layers,
        config.hidden_size,
        (("float32 with bfloat16 linear weights" if bf16_weights
          else f"float32 with bfloat16 products in the linears from {BF16_GEMM_MIN_TOKENS} rows")
         + (" and bfloat16 prompt attention" if model.bf16_prefill_attention else ""))
        if bf16_weights or bf16_codes else dtype,
        device,
        weights.quantization.describe() + (f" ({describe_gguf(weights.gguf)})" if weights.gguf else ""),
    )
    return model, config
