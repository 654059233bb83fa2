"""A client that goes away cancels its Triton request: the fake records the stream closed before its end."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from tests.front.conftest import LiveServer


def wait_for(condition, limit_s: float = 20.0) -> bool:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


@pytest.mark.parametrize(
    "route,body",
    [
        ("/generate_stream", {"inputs": "slow", "parameters": {"max_new_tokens": 50}}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "slow"}], "stream": True}),
        ("/v1/completions", {"prompt": "slow", "stream": True}),
    ],
)
def test_closing_a_stream_cancels_the_request(live: LiveServer, route: str, body: dict) -> None:
    with httpx.Client(base_url=live.url) as http, http.stream("POST", route, json=body) as r:
        assert r.status_code == 200
        first = next(line for line in r.iter_lines() if line.startswith("data:"))
        assert json.loads(first[len("data:"):])  # one token came; the next waits forever
    assert wait_for(lambda: len(live.fake.cancelled) == 1)
    assert live.fake.finished == []


def test_disconnect_during_non_streaming_generate_cancels(live: LiveServer) -> None:
    body = {"inputs": "slow", "parameters": {"max_new_tokens": 50}}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(live.url + "/generate", json=body, timeout=httpx.Timeout(5.0, read=0.5))
    assert wait_for(lambda: len(live.fake.cancelled) == 1)
    assert live.fake.finished == []
