"""Front fixtures: the app over a fake Triton client, in-process (TestClient) or served by uvicorn."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")

from fastapi.testclient import TestClient  # noqa: E402

from tests.front.fake_client import FakeTritonClient  # noqa: E402
from tgi_llm.front.app import create_app  # noqa: E402
from tgi_llm.front.config import FrontConfig  # noqa: E402

MODEL_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"


@pytest.fixture(scope="session")
def front_tokenizer(default_model_dir: Path) -> Any:
    from tgi_llm.front.tokenizer import load_tokenizer

    return load_tokenizer(default_model_dir)


@pytest.fixture
def fake() -> FakeTritonClient:
    return FakeTritonClient()


@pytest.fixture
def client(fake: FakeTritonClient, front_tokenizer: Any) -> Iterator[TestClient]:
    app = create_app(FrontConfig(model_id=MODEL_ID), fake, front_tokenizer)
    with TestClient(app) as test_client:
        yield test_client


@dataclass
class LiveServer:
    url: str
    fake: FakeTritonClient


def serve_in_thread(app: Any) -> Iterator[str]:
    """uvicorn on a free 127.0.0.1 port in a thread; yields the base URL; stops it afterwards."""
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        while not server.started:
            if not thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            thread.join(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


@pytest.fixture
def live(fake: FakeTritonClient, front_tokenizer: Any, request: pytest.FixtureRequest) -> Iterator[LiveServer]:
    """The app served for real over HTTP, for SDK clients and disconnects."""
    app = create_app(FrontConfig(model_id=MODEL_ID), fake, front_tokenizer)
    for url in serve_in_thread(app):
        yield LiveServer(url, fake)
