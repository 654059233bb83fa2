"""Any decoder-only causal LM transformers ships, served with transformers' own modeling code and our paged
attention (the way vLLM's and SGLang's Transformers backends work).

Our attention is registered under transformers' attention interface (`AttentionInterface`), and a mask
function that builds no mask under its mask interface: every attention layer of the model then calls
`paged_attention` with its q/k/v for the step's flat batch (one "batch row" of T tokens, positions given
per token), which writes K/V into our blocks and attends over each sequence's blocks with the layer's
scale, sliding window and soft-cap. Continuous batching, the prefix cache, chunked prefill, grammars and
every API then work as for a native family; only the rows the sampler needs go through the LM head.

Start-up refuses what this cannot serve (backed_config.py): encoder-decoder and multimodal checkpoints, and
models with layers that are not attention (state-space, linear attention): a warm-up forward must reach
`paged_attention` once per layer.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tgi_llm.attention import AttentionBackend, select_attention_backend
from tgi_llm.attention.metadata import AttentionMetadata
from tgi_llm.lora.targets import LayerTargets, LoraTarget
from tgi_llm.lora.weights import LinearLora, LoraBatch, ModelLora
from tgi_llm.models.config import ModelConfig

logger = logging.getLogger(__name__)

ATTENTION = "tgi_llm_paged"
#: A module inside a decoder layer: the layer's index and the module's path in it (model.layers.3.mlp.fc1).
_IN_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.(.+)$")


@dataclass
class _Step:
    kv_caches: list[tuple[torch.Tensor, torch.Tensor]]
    attn: AttentionMetadata
    backend: AttentionBackend
    layers: set[int] = field(default_factory=set)  # the layers that attended through us this step


_STEP: _Step | None = None  # the forward in progress (the engine runs one step at a time)


def paged_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                    sliding_window: int | None = None, softcap: float | None = None, **_kwargs: Any
                    ) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract: q [1, Hq, T, D], k/v [1, Hkv, T, D] -> ([1, T, Hq, D], None)."""
    step = _STEP
    if step is None:
        raise RuntimeError("paged attention called outside a step")
    layer = module.layer_idx
    step.layers.add(layer)
    k_cache, v_cache = step.kv_caches[layer]
    if key.shape[1] != k_cache.shape[2] or key.shape[3] != k_cache.shape[3]:
        raise ValueError(f"layer {layer} attends with {key.shape[1]} KV heads of {key.shape[3]}; the config said "
                         f"{k_cache.shape[2]} of {k_cache.shape[3]} (num_key_value_heads, head_dim)")
    q, k, v = (t[0].transpose(0, 1).contiguous() for t in (query, key, value))
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    out = step.backend.forward(q, k, v, k_cache, v_cache, step.attn, scale, window=sliding_window, softcap=softcap)
    return out[None], None


def _no_mask(*_args: Any, **_kwargs: Any) -> None:
    return None


def register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(ATTENTION, paged_attention)
    AttentionMaskInterface.register(ATTENTION, _no_mask)


class TransformersCausalLM(nn.Module):
    """A transformers causal LM behind the runner's model contract (forward over a flat paged batch,
    compute_logits for the sampled rows)."""

    def __init__(self, hf_model: nn.Module, config: ModelConfig) -> None:
        super().__init__()
        self.hf = hf_model
        self.config = config
        self.attention_backend: AttentionBackend | None = None
        self.float_kernels = None  # the native models' C linears: not here
        self.checked = False
        #: The resident LoRA adapters (attach_lora) and the forward's rows' slots, read by the linears' hooks.
        self.lora: ModelLora | None = None
        self._lora_batch: LoraBatch | None = None

    def _layer_linears(self) -> dict[tuple[int, str], nn.Linear]:
        """Every nn.Linear inside a decoder layer, by (layer, its path in the layer)."""
        out = {}
        for name, module in self.hf.named_modules():
            match = _IN_LAYER.search(name)
            if match and isinstance(module, nn.Linear):
                out[(int(match[1]), match[2])] = module
        return out

    def lora_targets(self) -> LayerTargets:
        """Adapters may change any linear of a decoder layer, named by its path there (PEFT's key)."""
        by_layer: dict[int, dict[str, LoraTarget]] = {}
        for (layer, path), module in self._layer_linears().items():
            by_layer.setdefault(layer, {})[path] = LoraTarget(path, (path.rsplit(".", 1)[-1],), (module.out_features,),
                                                              module.in_features, "column")
        return lambda index: by_layer.get(index, {})

    def attach_lora(self, lora: ModelLora) -> None:
        """A forward hook on each linear adds its rows' adapter products to its output."""
        self.lora = lora
        for (layer, path), module in self._layer_linears().items():
            linear = lora.layers[layer][path]
            module.register_forward_hook(lambda _m, inputs, output, linear=linear: self._add_lora(linear, inputs,
                                                                                                   output))

    def _add_lora(self, linear: LinearLora, inputs: tuple, output: torch.Tensor) -> None:
        if self._lora_batch is not None:
            linear.add(inputs[0].reshape(-1, linear.in_features), output.view(-1, linear.out_features),
                       self._lora_batch)

    @property
    def dtype(self) -> torch.dtype:
        return next(self.hf.parameters()).dtype

    @property
    def device(self) -> torch.device:
        return next(self.hf.parameters()).device

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                kv_caches: list[tuple[torch.Tensor, torch.Tensor]], attn: AttentionMetadata,
                lora: LoraBatch | None = None) -> torch.Tensor:
        global _STEP
        if self.attention_backend is None:
            self.attention_backend = select_attention_backend(input_ids.device, attn.block_size)
        _STEP = step = _Step(kv_caches, attn, self.attention_backend)
        self._lora_batch = lora
        try:
            out = self.hf.get_decoder()(input_ids=input_ids[None], position_ids=positions[None], use_cache=False)
        finally:
            _STEP = None
            self._lora_batch = None
        if not self.checked:
            missing = self.config.num_hidden_layers - len(step.layers)
            if missing:
                raise ValueError(f"{self.config.model_type}: {missing} of {self.config.num_hidden_layers} layers do "
                                 "not use transformers' attention interface (state-space or linear attention); "
                                 "not served")
            self.checked = True
        return out.last_hidden_state[0]

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The LM head over the sampled rows, with the scalings transformers' causal LMs apply after it."""
        cfg = self.hf.config
        logits = self.hf.get_output_embeddings()(hidden).float()
        if (scale := getattr(cfg, "logit_scale", None)) is not None:  # Cohere
            logits = logits * scale
        if (divisor := getattr(cfg, "logits_scaling", None)) is not None:  # Granite-style
            logits = logits / divisor
        if (cap := getattr(cfg, "final_logit_softcapping", None)) is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits


def load_backed_model(model_dir: str | Path, config: ModelConfig, dtype: torch.dtype,
                      device: str | torch.device) -> TransformersCausalLM:
    from transformers import AutoModelForCausalLM

    register()
    hf = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype, attn_implementation=ATTENTION)
    model = TransformersCausalLM(hf.to(device).eval(), config)
    logger.info("loaded %s (%s, served through transformers' modeling code with paged attention: no native "
                "family; %d layers, hidden %d) as %s on %s", model_dir, config.model_type,
                config.num_hidden_layers, config.hidden_size, dtype, device)
    return model
