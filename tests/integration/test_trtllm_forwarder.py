"""What Triton's OpenAI-compatible front end and genai-perf's TensorRT-LLM mode send to a model that is not a
vLLM one (TensorRT-LLM's shapes: [1, 1] scalars, stop_words [1, N]), replayed over gRPC against a launched
server, which serves tgi_llm_trtllm beside tgi_llm (the checked-in model_repository holds both too)."""

from __future__ import annotations

import json
import queue
from pathlib import Path

import numpy as np
import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def tritonserver(server) -> str:
    """The launched server's public gRPC port: the launcher serves tgi_llm_trtllm beside tgi_llm."""
    return server.grpc


def trtllm_inputs(prompt: str, stream: bool, **extra) -> list:
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import np_to_triton_dtype

    arrays = {"text_input": np.array([[prompt.encode()]], dtype=np.object_), "stream": np.array([[stream]]),
              "max_tokens": np.array([[12]], dtype=np.int32), "temperature": np.array([[0.0]], dtype=np.float32)}
    arrays |= extra
    out = []
    for name, array in arrays.items():
        tensor = grpcclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        tensor.set_data_from_numpy(array)
        out.append(tensor)
    return out


def run(url: str, inputs: list) -> list:
    import tritonclient.grpc as grpcclient

    responses: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    client.async_stream_infer("tgi_llm_trtllm", inputs, enable_empty_final_response=True)
    got = []
    while True:
        result, error = responses.get(timeout=300)
        assert error is None, error
        got.append(result)
        if result.get_response().parameters["triton_final_response"].bool_param:
            client.stop_stream()
            client.close()
            return got


def texts(responses: list) -> list[str]:
    out = []
    for r in responses:
        array = r.as_numpy("text_output")
        if array is not None:
            assert array.shape[0] == 1  # the batch dimension comes back
            out.append(array.reshape(-1)[0].decode())
    return out


@pytest.fixture(scope="module")
def prompt(default_model_dir) -> str:
    """The front end renders the chat template itself and sends the text."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(default_model_dir)
    return tokenizer.apply_chat_template(QUESTION, tokenize=False, add_generation_prompt=True)


def test_openai_front_end_requests_in_tensorrt_llm_shapes(tritonserver, prompt):
    whole = run(tritonserver, trtllm_inputs(prompt, False))
    assert len(whole) <= 2  # the front end's rule for a request that does not stream
    (answer,) = texts(whole)
    assert "Paris" in answer
    streamed = run(tritonserver, trtllm_inputs(prompt, True))
    assert "".join(texts(streamed)) == answer and len(texts(streamed)) > 1
    stopped = run(tritonserver, trtllm_inputs(prompt, False, stop_words=np.array([[b"Paris", b"zzz"]],
                                                                                   dtype=np.object_)))
    assert "".join(texts(stopped)).endswith("Paris")
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"]}
    guided = run(tritonserver, trtllm_inputs(prompt, False, max_tokens=np.array([[40]], dtype=np.int32),
                                             guided_decoding_guide_type=np.array([[b"json_schema"]], dtype=np.object_),
                                             guided_decoding_guide=np.array([[json.dumps(schema).encode()]],
                                                                            dtype=np.object_)))
    assert isinstance(json.loads("".join(texts(guided)))["city"], str)
