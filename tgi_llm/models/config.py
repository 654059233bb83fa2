"""ModelConfig: the architecture facts the runner needs (models/registry.py reads them from a config.json)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from tgi_llm.models.rope_config import RopeConfig

if TYPE_CHECKING:
    import torch

#: The MLP activations served, by transformers' `hidden_act` names (models/layers/activation.py runs them):
#: SiLU, exact GELU and GELU's tanh approximation. The C layer stack runs SiLU and the tanh GELU.
SILU_NAMES = ("silu", "swish")
TANH_GELU_NAMES = ("gelu_pytorch_tanh", "gelu_new", "gelu_fast")
ACTIVATION_NAMES = (*SILU_NAMES, "gelu", *TANH_GELU_NAMES)


def check_activation(name: str) -> None:
    if name not in ACTIVATION_NAMES:
        raise ValueError(f"`hidden_act` {name!r} is not supported; supported: {', '.join(ACTIVATION_NAMES)}")



@dataclass(frozen=True)
class NormNames:
    """The checkpoint's name for each norm a decoder layer may have (None: the family has none there).
    Llama normalizes each block's input; OLMo 2 each block's output; Gemma 2 and 3 both ("sandwich")."""

    attn_in: str | None = "input_layernorm"
    attn_out: str | None = None
    mlp_in: str | None = "post_attention_layernorm"
    mlp_out: str | None = None


@dataclass(frozen=True)
class MoeSpec:
    """A mixture-of-experts MLP: its experts' checkpoint names and routing."""

    num_experts: int
    top_k: int
    intermediate_size: int  # each expert's
    normalize: bool  # renormalize the chosen experts' probabilities (Mixtral; Qwen3-MoE's norm_topk_prob)
    prefix: str  # the layer's MoE module: "block_sparse_moe" (Mixtral) or "mlp" (Qwen3-MoE)
    names: tuple[str, str, str]  # each expert's gate, up and down: ("w1", "w3", "w2") for Mixtral
    sparse_layers: tuple[bool, ...]  # per layer: experts (True) or a dense MLP


@dataclass(frozen=True)
class ModelConfig:
    model_type: str
    family: str  # the registry's name for the architecture that serves it (models/families)
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    rms_norm_eps: float
    rope: RopeConfig
    max_position_embeddings: int
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    hidden_act: str = "silu"
    norms: NormNames = NormNames()
    #: RMSNorm over q and k before rope: per head (Qwen3, Gemma 3) or over the whole projection (OLMo 2).
    qk_norm: Literal["head", "projection"] | None = None
    norm_offset: float = 0.0  # Gemma scales by (1 + w): added to each norm weight at load
    embedding_multiplier: float = 1.0  # Granite; Gemma's sqrt(hidden_size)
    residual_multiplier: float = 1.0  # Granite: each block's output is scaled before the residual add
    attention_scale: float | None = None  # None: head_dim ** -0.5 (Granite's attention_multiplier, Gemma's scalar)
    logits_divisor: float = 1.0  # Granite's logits_scaling
    attn_logit_softcap: float | None = None  # Gemma 2: scores -> cap * tanh(scores / cap)
    final_logit_softcap: float | None = None  # Gemma 2: the same on the logits
    #: Per layer: the keys a query sees (the last W positions, itself included), None for the whole context;
    #: empty when no layer slides.
    sliding_windows: tuple[int | None, ...] = ()
    #: Per layer: whether it applies rope (SmolLM3 leaves every fourth layer without); empty: all do.
    rope_layers: tuple[bool, ...] = ()
    #: Gemma 3: the sliding layers' own rope (their base), None: every layer uses `rope`.
    local_rope: RopeConfig | None = None
    fused_qkv: bool = False  # Phi-3: one qkv_proj weight in the checkpoint
    fused_gate_up: bool = False  # Phi-3: one gate_up_proj weight
    moe: MoeSpec | None = None  # Mixtral, Qwen3-MoE
    #: Why this architecture cannot be split over shards (None: it can).
    tensor_parallel_refusal: str | None = None
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.family != "transformers":  # (transformers' code runs its own activations)
            check_activation(self.hidden_act)

    @property
    def num_queries_per_kv(self) -> int:
        return self.num_attention_heads // self.num_key_value_heads

    @property
    def layer_stack_refusal(self) -> str | None:
        """What in these layers the C layer stack does not implement (None: it runs them). It has norms
        before and after each block, q/k norms, layers without rope, with local rope tables or with rope on
        part of each head, residual scales, SiLU or tanh-GELU gates and mixtures of experts; sliding windows
        only while no sequence has outgrown them (`narrowest_window`); soft-capped scores in decode steps
        only."""
        if self.hidden_act not in (*SILU_NAMES, *TANH_GELU_NAMES):
            return f"the {self.hidden_act} activation"
        return None

    @property
    def narrowest_window(self) -> int | None:
        return min((w for w in self.sliding_windows if w), default=None)

    def window(self, layer: int) -> int | None:
        return self.sliding_windows[layer] if self.sliding_windows else None

    def uses_rope(self, layer: int) -> bool:
        return self.rope_layers[layer] if self.rope_layers else True

def common_fields(cfg: dict[str, Any]) -> dict[str, Any]:
    """What every family's config.json says the same way; a family's `configure` overrides any of it."""
    heads = cfg["num_attention_heads"]
    kv_heads = cfg.get("num_key_value_heads") or heads
    if heads % kv_heads:
        raise ValueError(f"num_attention_heads {heads} not a multiple of num_key_value_heads {kv_heads}")
    attention_bias = bool(cfg.get("attention_bias", False))
    eos = cfg.get("eos_token_id")
    return dict(
        model_type=cfg.get("model_type", ""),
        hidden_size=cfg["hidden_size"],
        intermediate_size=cfg["intermediate_size"],
        num_hidden_layers=cfg["num_hidden_layers"],
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
        vocab_size=cfg["vocab_size"],
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope=RopeConfig.from_hf(cfg),
        max_position_embeddings=cfg.get("max_position_embeddings", 2048),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        qkv_bias=attention_bias,
        o_bias=attention_bias,
        mlp_bias=bool(cfg.get("mlp_bias", False)),
        bos_token_id=cfg.get("bos_token_id"),
        eos_token_ids=tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,)),
        hidden_act=cfg.get("hidden_act") or cfg.get("hidden_activation") or "silu",
        sliding_windows=sliding_windows(cfg),
    )


def sliding_windows(cfg: dict[str, Any]) -> tuple[int | None, ...]:
    """Per layer, the window transformers applies: `layer_types` where the config has them (transformers 5),
    else `sliding_window` on every layer unless `use_sliding_window` is false (Qwen2's older configs, where
    layers from `max_window_layers` on slide)."""
    window = cfg.get("sliding_window")
    layers = cfg["num_hidden_layers"]
    if not window or cfg.get("use_sliding_window") is False:
        return ()
    types = cfg.get("layer_types")
    if types:
        windows = tuple(window if kind == "sliding_attention" else None for kind in types)
    elif "max_window_layers" in cfg:
        windows = tuple(window if i >= cfg["max_window_layers"] else None for i in range(layers))
    else:
        windows = (window,) * layers
    return windows if any(windows) else ()


def kv_cache_bytes_per_token(config: ModelConfig, dtype: torch.dtype) -> int:
    """K and V, every layer, every KV head: what one cached token costs (int8: codes and scales)."""
    from tgi_llm.kv_cache import kv_element_bytes  # torch: this module stays importable without it (the launcher)

    return round(2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim
                 * kv_element_bytes(dtype))


def attention_cost_per_context_token(config: ModelConfig) -> float:
    """What attending to one more token of context costs a token, as a fraction of its linears: q.k and p.v
    take 4 * heads * head_dim FLOPs per context token per layer; the layer's linears take 2 per weight. A
    prompt chunk's tokens late in a long prompt cost ~1.5x its first ones (SmolLM2, 1,500 tokens)."""
    h, d = config.hidden_size, config.head_dim
    per_layer = (h * config.num_attention_heads * d * 2 + h * config.num_key_value_heads * d * 2
                 + 3 * h * config.intermediate_size)
    return 4 * config.num_attention_heads * d / (2 * per_layer)
