"""What the front is told at start: where Triton is, which model, the API key and the limits /info reports."""

from __future__ import annotations

from dataclasses import dataclass

from tgi_llm import __version__
from tgi_llm.gateway.body import DEFAULT_PAYLOAD_LIMIT


@dataclass(frozen=True)
class InfoLimits:
    """The launcher's resolved limits, reported as TGI's /info does (the engine enforces them)."""

    max_concurrent_requests: int = 128
    max_best_of: int = 2
    max_stop_sequences: int = 4
    max_top_n_tokens: int = 5
    max_input_tokens: int | None = None
    max_total_tokens: int | None = None
    max_client_batch_size: int = 4
    validation_workers: int = 2
    max_batch_total_tokens: int | None = None
    max_batch_prefill_tokens: int | None = None
    max_waiting_tokens: int = 20
    max_batch_size: int | None = None
    waiting_served_ratio: float = 0.3


@dataclass(frozen=True)
class FrontConfig:
    model_id: str = "tgi_llm"  # what /info, /v1/models and OpenAI responses call the model
    model_name: str = "tgi_llm"  # the Triton model
    api_key: str | None = None
    payload_limit: int = DEFAULT_PAYLOAD_LIMIT  # TGI's --payload-limit, in bytes
    limits: InfoLimits = InfoLimits()
    model_dtype: str | None = None
    model_device_type: str | None = None
    #: Which code serves the model: a native family's name (models/families), or "transformers".
    model_family: str | None = None
    #: "auto": a thinking model's <think> part is returned as `reasoning_content`; "none": left inline.
    reasoning_format: str = "auto"
    #: LoRA adapters: "off", "startup" (--lora-adapters), or "runtime" (--lora-runtime-loading: the load and
    #: unload routes too).
    lora: str = "off"
    version: str = __version__

    def adapter_for(self, model: str | None) -> str | None:
        """The LoRA adapter OpenAI's `model` names, or None for the base model: with adapters, any name but the
        served model's (its id, its last path part, Triton's model name, TGI's "tgi") is an adapter's, and an
        unknown one is refused by the model; without adapters `model` is ignored, as TGI does."""
        if self.lora == "off" or not model:
            return None
        base = {self.model_id, self.model_id.rstrip("/").rsplit("/", 1)[-1], self.model_name, "tgi"}
        return None if model in base else model

    @property
    def system_fingerprint(self) -> str:
        return f"{self.version}-native"

    def info(self) -> dict:
        """TGI's /info body (router `Info`)."""
        return {
            "model_id": self.model_id,
            "model_sha": None,
            "model_pipeline_tag": "text-generation",
            "model_dtype": self.model_dtype,
            "model_device_type": self.model_device_type,
            "model_family": self.model_family,
            **self.limits.__dict__,
            "router": "text-generation-router",
            "version": self.version,
            "sha": None,
            "docker_label": None,
        }
