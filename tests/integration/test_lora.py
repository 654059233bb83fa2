"""LoRA adapters on a real server, as users reach them: OpenAI's `model` (the openai client), TGI's
`adapter_id`, Triton's `lora_name` input (tritonclient), /v1/models, vLLM's load and unload routes with a
request in flight, and the Gateway API Inference Extension's `vllm:lora_requests_info` gauge."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from tests.lora.peft_adapters import make_adapter
from tgi_llm.ports import free_ports

from .conftest import SERVER_FLAGS, serving
from .harness import grpc_generate, read_metrics, wait_until

PROMPT = "Write one sentence about the sea."


@pytest.fixture(scope="module")
def adapters(default_model_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("adapters")
    return {name: str(make_adapter(default_model_dir, tmp / name, seed, r=8, scale=0.08))
            for seed, name in enumerate(("alpha", "beta", "gamma"), start=1)}


@pytest.fixture(scope="module")
def lora_server(tmp_path_factory, adapters):
    (port,) = free_ports(1)
    flags = (*SERVER_FLAGS, "--port", str(port), "--lora-adapters",
             f"alpha={adapters['alpha']},beta={adapters['beta']}", "--max-loras", "2", "--lora-runtime-loading")
    for server in serving(tmp_path_factory.mktemp("lora"), *flags):
        yield server, f"http://127.0.0.1:{port}"


def _post(url: str, body: dict) -> tuple[int, str]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def _completion(front: str, model: str, max_tokens: int = 12) -> str:
    from openai import OpenAI

    client = OpenAI(base_url=front + "/v1", api_key="none")
    reply = client.completions.create(model=model, prompt=PROMPT, max_tokens=max_tokens, temperature=0)
    assert reply.model == model or model == "tgi"  # an adapter's answer names it, as vLLM's do
    return reply.choices[0].text


def test_models_lists_the_base_and_every_adapter(lora_server):
    from openai import OpenAI

    _, front = lora_server
    ids = [m.id for m in OpenAI(base_url=front + "/v1", api_key="none").models.list()]
    assert ids[1:] == ["alpha", "beta"]


def test_every_route_picks_the_same_adapter(lora_server):
    server, front = lora_server
    base = _completion(front, "tgi")
    alpha = _completion(front, "alpha")
    assert alpha != base and _completion(front, "beta") not in (base, alpha)
    status, body = _post(front + "/generate", {"inputs": PROMPT, "parameters": {"adapter_id": "alpha",
                                                                                "max_new_tokens": 12}})
    assert status == 200 and json.loads(body)["generated_text"] == alpha
    reply = grpc_generate(server, PROMPT, stream=True, lora_name="alpha", max_tokens=12)
    assert reply.error is None and reply.text == alpha


def test_unknown_adapters_are_4xx_naming_them(lora_server):
    import openai

    server, front = lora_server
    with pytest.raises(openai.BadRequestError, match="'nope' is not loaded"):
        _completion(front, "nope")
    status, body = _post(front + "/generate", {"inputs": PROMPT, "parameters": {"adapter_id": "nope"}})
    assert status == 422 and "'nope' is not loaded" in body
    reply = grpc_generate(server, PROMPT, lora_name="nope")
    assert reply.error is not None and "'nope' is not loaded" in str(reply.error)


def test_load_use_unload_and_reload_at_run_time(lora_server, adapters):
    _, front = lora_server
    status, body = _post(front + "/v1/load_lora_adapter", {"lora_name": "gamma", "lora_path": adapters["gamma"]})
    assert status == 200 and "gamma" in body
    assert _post(front + "/v1/load_lora_adapter", {"lora_name": "gamma", "lora_path": adapters["gamma"]})[0] == 400
    gamma = _completion(front, "gamma")
    # a long answer in flight while its adapter is unloaded: it ends normally, with gamma's tokens
    from openai import OpenAI

    stream = OpenAI(base_url=front + "/v1", api_key="none").completions.create(
        model="gamma", prompt=PROMPT, max_tokens=100, temperature=0, stream=True)
    chunks = iter(stream)
    text = next(chunks).choices[0].text  # running now
    status, _ = _post(front + "/v1/unload_lora_adapter", {"lora_name": "gamma"})
    assert status == 200
    text += "".join(c.choices[0].text for c in chunks if c.choices)
    assert text.startswith(gamma) and len(text) > len(gamma)
    assert _post(front + "/v1/unload_lora_adapter", {"lora_name": "gamma"})[0] == 404
    status, body = _post(front + "/v1/completions", {"model": "gamma", "prompt": PROMPT, "max_tokens": 4})
    assert status == 400 and "'gamma' is not loaded" in body
    # three registered adapters take turns in two slots
    assert _post(front + "/v1/load_lora_adapter", {"lora_name": "gamma", "lora_path": adapters["gamma"]})[0] == 200
    assert [_completion(front, name) for name in ("alpha", "gamma", "beta", "gamma")][1] == gamma


def test_a_bad_adapter_is_a_400_naming_what_is_wrong(lora_server, tmp_path):
    _, front = lora_server
    status, body = _post(front + "/v1/load_lora_adapter", {"lora_name": "ghost", "lora_path": str(tmp_path)})
    assert status == 400 and "adapter_config.json" in body


def _lora_info(server) -> dict[str, str]:
    """The latest series, as the endpoint picker reads it: the one of the largest value (its time)."""
    series = [(value, dict(labels)) for (name, labels), value in read_metrics(server).items()
              if name == "vllm:lora_requests_info"]
    return max(series, key=lambda s: s[0])[1] if series else {}


def test_the_gateway_gauge_and_per_adapter_counts(lora_server):
    server, front = lora_server
    _completion(front, "beta")
    assert wait_until(lambda: _lora_info(server).get("max_lora") == "2", 10, 0.1)
    snapshot = read_metrics(server)
    counts = {dict(labels)["adapter"]: value for (name, labels), value in snapshot.items()
              if name == "tgi_lora_requests"}
    assert counts.get("beta", 0) >= 1
    memory = {dict(labels)["kind"]: value for (name, labels), value in snapshot.items() if name == "tgi_memory_bytes"}
    assert memory.get("lora_adapters", 0) > 0
