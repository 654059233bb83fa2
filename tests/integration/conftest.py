"""One real server for the whole integration run (loading the model costs ~20-40 s on 2 cores)."""

from __future__ import annotations

import pytest

from .harness import START_TIMEOUT_S, Launched, launch, wait_until

#: Small limits keep the KV pool (and the tests) small: 16384 tokens = 1024 blocks of 16.
MAX_CONCURRENT_REQUESTS = 40
#: A short request deadline, so the slow-client test does not wait 30 s.
REQUEST_READ_TIMEOUT_S = 3
SERVER_FLAGS = ("--max-input-tokens", "512", "--max-total-tokens", "1024", "--max-batch-total-tokens", "16384",
                "--max-concurrent-requests", str(MAX_CONCURRENT_REQUESTS),
                "--request-read-timeout", str(REQUEST_READ_TIMEOUT_S))


def serving(work_dir, *flags: str):
    """A fixture's body: the launcher with `flags` until ready, yielded, then stopped; it must exit 0."""
    launched = launch(work_dir, *flags)
    try:
        up = wait_until(lambda: launched.ready() or launched.process.poll() is not None, START_TIMEOUT_S, 0.5)
        if not (up and launched.ready()):
            pytest.fail(f"server did not become ready:\n{launched.log_tail()}")
        yield launched
    finally:
        code = launched.stop()
    assert code == 0, f"launcher exited with {code} on SIGTERM:\n{launched.log_tail()}"


@pytest.fixture(scope="session")
def server(tmp_path_factory) -> Launched:
    yield from serving(tmp_path_factory.mktemp("server"), *SERVER_FLAGS)


@pytest.fixture(scope="session")
def reference():
    """The engine in this process, same model and limits: greedy text for a prompt, as the engine gives it."""
    from tgi_llm import LLM

    llm = LLM(max_input_tokens=512, max_total_tokens=1024, max_batch_total_tokens=4096)
    cache: dict[tuple[str, int], str] = {}

    def greedy(prompt: str, max_new_tokens: int) -> str:
        key = (prompt, max_new_tokens)
        if key not in cache:
            cache[key] = llm.generate([prompt], {"max_new_tokens": max_new_tokens})[0].text
        return cache[key]

    yield greedy
    llm.close()
