"""Speculation as the launcher serves it by default (`--speculate 4`), by a real tritonserver: output is
the engine's greedy text without speculation, on every route; the guesses are visible (details, the Triton
output, vLLM's and TGI's metrics); a request can turn it off, and asking for more than the server's limit
is a 400 naming the field."""

from __future__ import annotations

import json
import urllib.request

import pytest

from tgi_llm.ports import free_ports

from .conftest import SERVER_FLAGS
from .harness import START_TIMEOUT_S, http_generate, launch, metric, read_metrics, wait_until

TEXT = ("The billing service moved to the new cluster on Monday after three weeks in staging. Invoices, refunds "
        "and monthly renewals now run as separate queues with their own retries.")
PROMPT = f"Repeat this text exactly:\n\n{TEXT}\n\nRepeated text:\n\n"


@pytest.fixture(scope="module")
def spec_server(tmp_path_factory):
    (port,) = free_ports(1)
    server = launch(tmp_path_factory.mktemp("speculate"), *SERVER_FLAGS, "--port", str(port))
    try:
        if not wait_until(lambda: "Ready: HTTP" in server.log_path.read_text() or server.process.poll() is not None,
                          START_TIMEOUT_S, 0.5) or server.process.poll() is not None:
            pytest.fail(f"server did not start:\n{server.log_tail()}")
        yield server, f"http://127.0.0.1:{port}"
    finally:
        assert server.stop() == 0, server.log_tail()


def _post(url: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_metrics_count_drafted_and_accepted_tokens(spec_server):
    """First in the module: no other request's metrics can land while it counts. Whether a step guesses
    follows measured step times (policy.py), so the counts are checked against what the response says."""
    server, _ = spec_server
    before = read_metrics(server)
    status, body = http_generate(server, {"text_input": PROMPT, "max_tokens": 32})
    assert status == 200
    accepted = body["num_accepted_draft_tokens"]

    def delta(name: str) -> float:
        return metric(read_metrics(server), name) - metric(before, name)

    assert wait_until(lambda: delta("tgi_request_skipped_tokens_count") == 1)
    assert delta("tgi_request_skipped_tokens_sum") == accepted
    assert wait_until(lambda: delta("vllm:spec_decode_num_accepted_tokens") >= accepted)
    assert delta("vllm:spec_decode_num_draft_tokens") >= delta("vllm:spec_decode_num_accepted_tokens")
    assert delta("vllm:spec_decode_num_drafts") >= (1 if accepted else 0)


def test_tgi_route_gives_the_unspeculated_text_and_counts_the_accepted_guesses(spec_server, reference):
    _, front = spec_server
    accepted = []
    for _ in range(3):  # whether steps guess follows measured step times: a loaded host may hold them back
        status, body = _post(f"{front}/generate", {"inputs": PROMPT,
                                                   "parameters": {"max_new_tokens": 48, "details": True}})
        assert status == 200
        assert body["generated_text"] == reference(PROMPT, 48)
        details = body["details"]
        assert len(details["tokens"]) == details["generated_tokens"]
        accepted.append(details["accepted_draft_tokens"])
        if accepted[-1]:
            break
    assert 0 < accepted[-1] < details["generated_tokens"], accepted


def test_hub_client_stream_has_one_event_per_token(spec_server, reference):
    from huggingface_hub import InferenceClient

    _, front = spec_server
    client = InferenceClient(front)  # held: the stream reads through its session
    events = list(client.text_generation(PROMPT, max_new_tokens=40, stream=True, details=True))
    assert "".join(e.token.text for e in events) == reference(PROMPT, 40)
    assert len(events) == events[-1].details.generated_tokens == 40
    assert [e.details is not None for e in events].count(True) == 1


def test_a_request_turns_speculation_off_and_the_limit_is_checked(spec_server, reference):
    server, _ = spec_server
    status, body = http_generate(server, {"text_input": PROMPT, "max_tokens": 24, "speculate": 0})
    assert status == 200 and body["num_accepted_draft_tokens"] == 0
    assert body["text_output"] == reference(PROMPT, 24)
    status, body = http_generate(server, {"text_input": PROMPT, "max_tokens": 24, "speculate": 9})
    assert status == 400 and "`speculate` must be >= 0 and <= 4" in body["error"]
