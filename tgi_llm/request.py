"""A request after validation: what the scheduler, runner and sampler consume."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tgi_llm.engine.grammar import CompiledGrammar
    from tgi_llm.lora.registry import Adapter


@dataclass(frozen=True)
class SamplingParams:
    """Per-request logits processing. Neutral values disable a warper."""

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0  # 0: disabled
    top_p: float = 1.0  # 1.0: disabled
    typical_p: float = 1.0  # 1.0: disabled
    repetition_penalty: float = 1.0  # 1.0: disabled
    frequency_penalty: float = 0.0  # 0.0: disabled
    presence_penalty: float = 0.0  # 0.0: disabled (OpenAI's; TGI's chat route accepts it)
    seed: int = 0


@dataclass(frozen=True)
class StoppingParams:
    max_new_tokens: int
    stop_sequences: tuple[str, ...] = ()
    ignore_eos: bool = False
    #: EOS and stop sequences do not end the request before this many tokens (vLLM's min_tokens,
    #: TensorRT-LLM's min_length; TGI has none).
    min_new_tokens: int = 0


@dataclass(frozen=True)
class ValidRequest:
    """Everything the engine needs to run one generation; built only by `Validator`."""

    input_ids: tuple[int, ...]
    sampling: SamplingParams
    stopping: StoppingParams
    top_n_tokens: int = 0
    details: bool = False
    decoder_input_details: bool = False
    return_full_text: bool = False
    #: The prompt as text (None when the caller sent token ids); used for return_full_text.
    input_text: str | None = None
    #: Part of every prefix-cache key of this request: requests whose K/V differ for the same tokens (a
    #: LoRA adapter, a cache salt) must never share blocks. Empty: the base model's.
    cache_key: bytes = b""
    #: The output must match this grammar (compiled at validation; the runner keeps the matcher state).
    grammar: CompiledGrammar | None = field(default=None, compare=False)
    #: The LoRA adapter the request runs (None: the base model); `cache_key` is its key.
    lora: Adapter | None = field(default=None, compare=False)
    #: At most this many guessed tokens per step for this request (None: the server's --speculate).
    speculate: int | None = None
    #: Free-form tags the caller wants back in events (e.g. Triton's request id).
    tags: dict = field(default_factory=dict, compare=False)

    @property
    def input_length(self) -> int:
        return len(self.input_ids)
