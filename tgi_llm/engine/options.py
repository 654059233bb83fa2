"""Everything an engine is built from: the model, its dtype and device, and the limits."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from tgi_llm.engine.kv_events import check_kv_event_endpoints
from tgi_llm.engine.limits import LimitOptions
from tgi_llm.lora.spec import parse_lora_adapters
from tgi_llm.models.rope_override import RopeOverride
from tgi_llm.parallel.hosts import check_shard_hosts

DTYPES = ("float32", "bfloat16", "float16")
#: --kv-cache-dtype: auto (tgi_llm/kv_cache.py resolve_kv_cache_dtype) or the element type of the K/V caches.
KV_CACHE_DTYPES = ("auto", "float32", "bfloat16", "float16", "int8")
#: Bounds of --max-loras and --max-lora-rank.
MAX_LORA_LIMITS = {"max_loras": 256, "max_lora_rank": 512}


@dataclass(frozen=True)
class EngineOptions:
    model_id: str | None = None  # None: the default model (SmolLM2-135M-Instruct)
    dtype: str | None = None  # None: float32 on CPU, bfloat16 on CUDA
    device: str | None = None  # None: cuda when available, else cpu
    kv_cache_memory_gb: float | None = None  # None: derived from free memory
    kv_cache_dtype: str | None = None  # None: auto
    num_shard: int = 1
    #: --shard-hosts / --shard-master-addr (tgi_llm/parallel/hosts.py): shard ranks on other hosts (None: here).
    shard_hosts: str | None = None
    shard_master_addr: str | None = None
    quantize: str | None = None  # --quantize (tgi_llm/quant/modes.py); None: by the weights
    quantize_group_size: int | None = None
    #: A smaller model with the same tokenizer that guesses tokens for --speculate (None: prompt lookup).
    speculative_model: str | None = None
    #: --rope-scaling (linear, dynamic) and --rope-factor: TGI's pair (rope_override.py); None: the config's rope.
    rope_scaling: str | None = None
    rope_factor: float | None = None
    #: --lora-adapters: TGI's `id=path,...` (lora/spec.py), read at start-up.
    lora_adapters: str | None = None
    #: Adapters resident at once (None: as many as --lora-adapters names, at least 1).
    max_loras: int | None = None
    #: The largest adapter rank (None: the largest of --lora-adapters', else 16).
    max_lora_rank: int | None = None
    #: POST /v1/load_lora_adapter and /v1/unload_lora_adapter may change the adapters at run time.
    lora_runtime_loading: bool = False
    #: --kv-events-endpoint: publish the prefix cache's stored/removed blocks over ZMQ (vLLM's format); None: off.
    kv_events_endpoint: str | None = None
    #: --kv-events-replay-endpoint: a ROUTER socket that resends recent batches to a subscriber that saw a gap.
    kv_events_replay_endpoint: str | None = None
    #: --kv-events-topic: the first frame of every message (llm-d subscribes to `kv@<pod ip>@<model>`).
    kv_events_topic: str = ""
    limits: LimitOptions = field(default_factory=LimitOptions)

    def __post_init__(self) -> None:
        if self.dtype is not None and self.dtype not in DTYPES:
            raise ValueError(f"`dtype` must be one of {', '.join(DTYPES)}. Given: {self.dtype}")
        if self.kv_cache_dtype is not None and self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"`kv_cache_dtype` must be one of {', '.join(KV_CACHE_DTYPES)}. "
                             f"Given: {self.kv_cache_dtype}")
        if self.num_shard < 1:
            raise ValueError(f"`num_shard` must be >= 1. Given: {self.num_shard}")
        check_shard_hosts(self.shard_hosts, self.shard_master_addr, self.num_shard)
        RopeOverride.from_flags(self.rope_scaling, self.rope_factor)  # a bad value fails here, naming its flag
        parse_lora_adapters(self.lora_adapters)
        check_kv_event_endpoints(self.kv_events_endpoint, self.kv_events_replay_endpoint)
        for name in ("max_loras", "max_lora_rank"):
            value = getattr(self, name)
            if value is not None and not 1 <= value <= MAX_LORA_LIMITS[name]:
                raise ValueError(f"`{name}` must be in 1..{MAX_LORA_LIMITS[name]}. Given: {value}")

    @property
    def rope_override(self) -> RopeOverride | None:
        return RopeOverride.from_flags(self.rope_scaling, self.rope_factor)

    @classmethod
    def from_parameters(cls, params: dict[str, Any]) -> EngineOptions:
        """Build from string key/values (Triton config parameters, env); empty strings mean unset."""
        values: dict[str, Any] = {}
        limits: dict[str, Any] = {}
        types = {f.name: f.type for f in fields(cls)} | {
            f.name: f.type for f in fields(LimitOptions)
        }
        for key, raw in params.items():
            if key not in types or raw is None or (isinstance(raw, str) and raw.strip() == ""):
                continue
            value = _parse(key, str(types[key]), raw)
            (limits if key in LimitOptions.__dataclass_fields__ else values)[key] = value
        return cls(**values, limits=LimitOptions(**limits))


_TRUE, _FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off"}


def _parse(key: str, type_name: str, raw: Any) -> Any:
    if not isinstance(raw, str):
        return raw
    if type_name == "bool":
        if raw.strip().lower() in _TRUE | _FALSE:
            return raw.strip().lower() in _TRUE
        raise ValueError(f"`{key}` must be true or false. Given: {raw!r}")
    try:
        if "int" in type_name:
            return int(raw)
        if "float" in type_name:
            return float(raw)
    except ValueError:
        raise ValueError(f"`{key}` must be a number. Given: {raw!r}") from None
    return raw
