"""A new user's first start: empty model and kernel caches, default flags, the locale they happen to have.

The Python backend's embedded interpreter decodes text as ASCII whatever the locale, and gcc quotes its
diagnostics in UTF-8 under a UTF-8 locale: the kernel build must never turn that into failed requests.
The fake compilers reproduce it on any machine (gcc prints nothing on an AVX-512 CPU)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import httpx
import pytest

from .harness import START_TIMEOUT_S, Launched, free_ports, http_generate, launch, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PROMPT = "What is the capital of France?"
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
NEW = 12
#: Left and right single quotation marks, as gcc prints them in a UTF-8 locale.
QUOTED = r"\342\200\230x\342\200\231"


def fake_compiler(directory: Path, fails: bool) -> Path:
    """A `cc` that prints non-ASCII diagnostics, then fails or runs the real compiler."""
    real = shutil.which("cc") or shutil.which("gcc")
    run = "exit 1" if fails else f'exec {real} "$@"'
    path = directory / ("failing-cc" if fails else "noisy-cc")
    path.write_text("#!/bin/sh\n"
                    'if [ "$1" = "--version" ]; then echo "fake-cc 1.0"; exit 0; fi\n'
                    f"printf 'note: {QUOTED} changes the ABI\\n' >&2\n"
                    f"{run}\n", encoding="utf-8")
    path.chmod(0o755)
    return path


def front_ready(port: int | None) -> bool:
    if port is None:
        return True
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def start(tmp: Path, env: dict[str, str | None], *flags: str, front_port: int | None = None) -> Launched:
    """The launcher with `flags`; ready once Triton's model and (given its port) the HTTP front are."""
    if front_port is not None:
        flags = (*flags, "--port", str(front_port))
    server = launch(tmp, *flags, env=env)
    serving = lambda: server.ready() and front_ready(front_port)  # noqa: E731
    up = wait_until(lambda: serving() or server.process.poll() is not None, START_TIMEOUT_S, 0.5)
    if not (up and serving()):
        server.stop()
        pytest.fail(f"server did not become ready:\n{server.log_tail()}")
    return server


def fresh_env(tmp: Path, lang: str, **extra: str) -> dict[str, str | None]:
    return {"LANG": lang, "LC_ALL": None, "LC_CTYPE": None, "PYTHONUTF8": None, "PYTHONIOENCODING": None,
            "TGI_LLM_CACHE": str(tmp / "model-cache"), "TGI_LLM_KERNEL_CACHE": str(tmp / "kernel-cache"),
            "TGI_LLM_CPU_KERNELS": None, "CC": None, **extra}


@pytest.fixture(scope="module")
def chat_prompt(default_model_dir: Path) -> str:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(default_model_dir)
    return tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)


@pytest.mark.parametrize("lang", ["C.UTF-8", "C"])
def test_first_start_answers_the_first_generate_and_chat(tmp_path, reference, chat_prompt, lang):
    (port,) = free_ports(1)
    server = start(tmp_path, fresh_env(tmp_path, lang), front_port=port)
    try:
        status, body = http_generate(server, {"text_input": PROMPT, "max_tokens": NEW})
        assert status == 200, body
        assert body["text_output"] == reference(PROMPT, NEW)
        reply = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=120,
                           json={"model": "tgi", "messages": MESSAGES, "max_tokens": NEW, "temperature": 0})
        assert reply.status_code == 200, reply.text
        assert reply.json()["choices"][0]["message"]["content"] == reference(chat_prompt, NEW)
        assert any((tmp_path / "kernel-cache").glob("*/libtgi_kernels.so"))  # built at start, then used
        chosen = r"CPU attention: C kernel for decode, (C kernel|SDPA) for prefill \(measured"
        assert re.search(chosen, server.log_tail(400))
    finally:
        assert server.stop() == 0, server.log_tail()


@pytest.mark.parametrize("fails", [False, True], ids=["noisy-compiler", "failing-compiler"])
def test_a_compiler_printing_non_ascii_never_fails_a_request(tmp_path, reference, default_model_dir, fails):
    compiler = fake_compiler(tmp_path, fails)
    env = fresh_env(tmp_path, "C.UTF-8", CC=str(compiler), TGI_LLM_CACHE=None)
    server = start(tmp_path, env, "--model-id", str(default_model_dir))
    try:
        for _ in range(2):  # the second request must not retry the build, nor fail
            status, body = http_generate(server, {"text_input": PROMPT, "max_tokens": NEW})
            assert status == 200, body
            assert body["text_output"] == reference(PROMPT, NEW)
        log = server.log_tail(400)
        if fails:
            assert "CPU attention: torch path" in log and "exited with 1" in log
            assert not any((tmp_path / "kernel-cache").glob("*.so"))
        else:
            assert "CPU attention: C kernel for decode" in log
    finally:
        assert server.stop() == 0, server.log_tail()
