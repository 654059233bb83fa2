"""The model repository tritonserver serves: config.pbtxt (tensors, decoupled policy, the engine's
options as `parameters`) and 1/model.py (a re-export of tgi_llm.triton.model).

model_repository/ in the checkout is `render_config(DEFAULT_PARAMETERS)`; a test keeps them equal.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from tgi_llm.engine.limits import SHORTEST_PROMPT
from tgi_llm.speculation.policy import SERVED_SPECULATE

MODEL_NAME = "tgi_llm"

MODEL_PY = '''"""Triton model `tgi_llm`: the adapter lives in the tgi_llm package (tgi_llm/triton/model.py)."""

from tgi_llm.triton.model import TritonPythonModel  # noqa: F401
'''
#: The same engine in TensorRT-LLM's tensor shapes, for the tools built for that backend (Triton's OpenAI front
#: end, genai-perf --backend tensorrtllm): a small BLS model that forwards to `tgi_llm`.
TRTLLM_MODEL_NAME = "tgi_llm_trtllm"
TRTLLM_MODEL_PY = '''\
"""Triton model `tgi_llm_trtllm`: tgi_llm with TensorRT-LLM's tensor shapes (tgi_llm/triton/trtllm_forwarder.py)."""

from tgi_llm.triton.trtllm_forwarder import TritonPythonModel  # noqa: F401
'''

#: (name, Triton type, dims). All optional (a prompt is text_input or input_ids); names follow Triton's vLLM and
#: TensorRT-LLM models, with TGI's parameter names beside them.
INPUTS: list[tuple[str, str, list[int]]] = [
    ("text_input", "TYPE_STRING", [1]),
    ("input_ids", "TYPE_INT64", [-1]),  # the prompt as token ids (lm-eval's tokenized requests)
    ("stream", "TYPE_BOOL", [1]),
    ("exclude_input_in_output", "TYPE_BOOL", [1]),
    ("return_full_text", "TYPE_BOOL", [1]),
    ("max_tokens", "TYPE_INT32", [1]),
    ("max_new_tokens", "TYPE_INT32", [1]),
    ("temperature", "TYPE_FP32", [1]),
    ("top_k", "TYPE_INT32", [1]),
    ("top_p", "TYPE_FP32", [1]),
    ("typical_p", "TYPE_FP32", [1]),
    ("repetition_penalty", "TYPE_FP32", [1]),
    ("frequency_penalty", "TYPE_FP32", [1]),
    ("presence_penalty", "TYPE_FP32", [1]),
    ("seed", "TYPE_UINT64", [1]),
    ("do_sample", "TYPE_BOOL", [1]),
    ("stop", "TYPE_STRING", [-1]),
    ("details", "TYPE_BOOL", [1]),
    ("top_n_tokens", "TYPE_INT32", [1]),
    ("truncate", "TYPE_INT32", [1]),
    ("decoder_input_details", "TYPE_BOOL", [1]),
    ("ignore_eos", "TYPE_BOOL", [1]),
    ("min_tokens", "TYPE_INT32", [1]),
    ("min_length", "TYPE_INT32", [1]),
    ("sampling_parameters", "TYPE_STRING", [1]),
    ("lora_name", "TYPE_STRING", [1]),  # the LoRA adapter (Triton's vLLM backend's name; TGI's adapter_id)
    # Structured output, as TensorRT-LLM and Triton's OpenAI front end name it: json (any JSON value),
    # json_schema, regex or ebnf_grammar, and the guide (schema, expression, grammar) itself.
    ("guided_decoding_guide_type", "TYPE_STRING", [1]),
    ("guided_decoding_guide", "TYPE_STRING", [1]),
    # Sent by Triton's OpenAI front end in vLLM's format; the counts always come back, so they change nothing.
    ("return_num_input_tokens", "TYPE_BOOL", [1]),
    ("return_num_output_tokens", "TYPE_BOOL", [1]),
]

OUTPUTS: list[tuple[str, str, list[int]]] = [
    ("text_output", "TYPE_STRING", [-1]),
    ("finish_reason", "TYPE_STRING", [-1]),
    ("num_input_tokens", "TYPE_UINT32", [-1]),
    ("num_output_tokens", "TYPE_UINT32", [-1]),
    ("num_cached_tokens", "TYPE_UINT32", [-1]),
    ("num_accepted_draft_tokens", "TYPE_UINT32", [-1]),
    ("seed", "TYPE_UINT64", [-1]),
    ("token_ids", "TYPE_INT64", [-1]),
    ("token_texts", "TYPE_STRING", [-1]),
    ("token_logprobs", "TYPE_FP32", [-1]),
    ("token_special", "TYPE_BOOL", [-1]),
    ("top_token_ids", "TYPE_INT64", [-1, -1]),
    ("top_token_texts", "TYPE_STRING", [-1, -1]),
    ("top_token_logprobs", "TYPE_FP32", [-1, -1]),
    ("prefill_token_ids", "TYPE_INT64", [-1]),
    ("prefill_token_texts", "TYPE_STRING", [-1]),
    ("prefill_token_logprobs", "TYPE_FP32", [-1]),
    ("prefill_top_token_ids", "TYPE_INT64", [-1, -1]),
    ("prefill_top_token_texts", "TYPE_STRING", [-1, -1]),
    ("prefill_top_token_logprobs", "TYPE_FP32", [-1, -1]),
]

#: The `parameters` block: EngineOptions / LimitOptions fields (empty = derive as TGI does) and the
#: adapter's own settings (json_output, cancellation_poll_ms, validation_workers).
DEFAULT_PARAMETERS: dict[str, str] = {
    "model_id": "",
    "dtype": "",
    "device": "",
    "num_shard": "1",
    "shard_hosts": "",
    "shard_master_addr": "",
    "quantize": "",
    "quantize_group_size": "",
    "kv_cache_memory_gb": "",
    "kv_cache_dtype": "",
    "rope_scaling": "",
    "rope_factor": "",
    "lora_adapters": "",
    "max_loras": "",
    "max_lora_rank": "",
    "lora_runtime_loading": "false",
    "kv_events_endpoint": "",
    "kv_events_replay_endpoint": "",
    "kv_events_topic": "",
    "max_concurrent_requests": "128",
    "max_best_of": "2",
    "max_stop_sequences": "4",
    "max_top_n_tokens": "5",
    "max_input_tokens": "",
    "max_total_tokens": "",
    "max_batch_prefill_tokens": "",
    "max_batch_total_tokens": "",
    "waiting_served_ratio": "0.3",
    "max_waiting_tokens": "20",
    "max_batch_size": "",
    "block_size": "16",
    "prefix_caching": "true",
    "prefill_chunking": "true",
    "prefill_step_target_ms": "",
    "scheduling_policy": SHORTEST_PROMPT,
    "speculate": str(SERVED_SPECULATE),
    "speculative_model": "",
    "json_output": "false",
    "cancellation_poll_ms": "100",
    "validation_workers": "2",
}


def _dims(dims: list[int]) -> str:
    return "[ " + ", ".join(str(d) for d in dims) + " ]"


def _tensor(name: str, dtype: str, dims: list[int], optional: bool) -> str:
    extra = "\n    optional: true" if optional else ""
    return f'  {{\n    name: "{name}"\n    data_type: {dtype}\n    dims: {_dims(dims)}{extra}\n  }}'


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def render_config(parameters: Mapping[str, str] | None = None, name: str = MODEL_NAME) -> str:
    params = dict(DEFAULT_PARAMETERS) | {k: str(v) for k, v in (parameters or {}).items()}
    inputs = ",\n".join(_tensor(n, t, d, True) for n, t, d in INPUTS)
    outputs = ",\n".join(_tensor(n, t, d, False) for n, t, d in OUTPUTS)
    params_text = "\n".join(
        f"parameters {{\n  key: {_quote(k)}\n  value: {{ string_value: {_quote(v)} }}\n}}" for k, v in params.items()
    )
    return f"""# Generated by tgi_llm.launcher.repository.render_config; the launcher writes its own copy.
name: "{name}"
backend: "python"
# The engine batches (continuous batching), so Triton hands over requests one by one.
max_batch_size: 0
# One request, many responses: one per token when streaming.
model_transaction_policy {{
  decoupled: true
}}
input [
{inputs}
]
output [
{outputs}
]
# One engine per server; it places itself on the GPU when there is one.
instance_group [
  {{
    count: 1
    kind: KIND_MODEL
  }}
]
{params_text}
"""


def write_repository(root: Path, parameters: Mapping[str, str] | None = None) -> Path:
    """Write the `tgi_llm` model (config.pbtxt with these parameters, 1/model.py) and its TensorRT-LLM-shaped
    forwarder `tgi_llm_trtllm` under root; returns root."""
    from tgi_llm.triton.trtllm_forwarder import render_config as render_forwarder_config

    for name, config, model_py in ((MODEL_NAME, render_config(parameters), MODEL_PY),
                                   (TRTLLM_MODEL_NAME, render_forwarder_config(TRTLLM_MODEL_NAME), TRTLLM_MODEL_PY)):
        (root / name / "1").mkdir(parents=True, exist_ok=True)
        (root / name / "config.pbtxt").write_text(config, encoding="utf-8")
        (root / name / "1" / "model.py").write_text(model_py, encoding="utf-8")
    return root
