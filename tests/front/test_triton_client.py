"""The real gRPC client against a fake Triton gRPC service: decoding, final flags, errors, cancellation."""

from __future__ import annotations

import asyncio

import pytest

from tests.front.fake_triton_grpc import start_fake_triton
from tgi_llm.front.errors import FrontError
from tgi_llm.front.generation import Generation
from tgi_llm.front.protocol import GenerateSpec
from tgi_llm.front.triton_client import TritonGrpcClient


def run(coro):
    return asyncio.run(coro)


async def with_fake(body, **servicer_fields):
    server, servicer, url = await start_fake_triton()
    for key, value in servicer_fields.items():
        setattr(servicer, key, value)
    client = TritonGrpcClient(url)
    try:
        return await body(client, servicer)
    finally:
        await client.close()
        await server.stop(None)


@pytest.mark.parametrize("final_alone", [False, True])
def test_stream_decodes_tokens_and_final(final_alone: bool) -> None:
    async def body(client, servicer):
        spec = GenerateSpec("hello", {"max_new_tokens": 3, "temperature": 0.5, "seed": 2**64 - 1,
                                      "stop": ["\n", "END"], "details": True}, stream=True)
        chunks = [c async for c in client.stream(spec, "req-1")]
        return chunks, servicer.requests[0]

    chunks, request = run(with_fake(body, final_alone=final_alone))
    assert [c.text for c in chunks] == [" t0", " t1", " t2"]
    assert [[t.id for t in c.tokens] for c in chunks] == [[10], [11], [12]]
    assert chunks[0].tokens[0].logprob == pytest.approx(-0.5)
    assert [c.final for c in chunks] == [False, False, True]
    assert (chunks[-1].finish_reason, chunks[-1].input_tokens, chunks[-1].generated_tokens) == ("length", 4, 3)
    # What Triton received: TGI parameters by name, the stop list as a tensor, the empty-final opt-in.
    assert request.id == "req-1" and request.model_name == "tgi_llm"
    inputs = {t.name: t for t in request.inputs}
    assert inputs["text_input"].contents.bytes_contents == [b"hello"]
    assert list(inputs["stream"].contents.bool_contents) == [True]
    assert list(inputs["stop"].contents.bytes_contents) == [b"\n", b"END"]
    assert request.parameters["temperature"].double_param == 0.5
    assert list(inputs["seed"].contents.uint64_contents) == [2**64 - 1]
    assert request.parameters["max_new_tokens"].int64_param == 3
    assert request.parameters["triton_enable_empty_final_response"].bool_param


def test_collect_non_streaming() -> None:
    async def body(client, servicer):
        return await Generation.collect(client.stream(GenerateSpec("x", {"max_new_tokens": 2}), "r"))

    gen = run(with_fake(body))
    assert gen.text == " t0 t1" and gen.generated_tokens == 2 and gen.finish_reason == "length"


@pytest.mark.parametrize(("code", "error_type", "status"), [("INVALID_ARG", "validation", 422),
                                                            ("INTERNAL", "generation", 424)])
def test_the_models_error_code_decides_the_tgi_error(code: str, error_type: str, status: int) -> None:
    """The model's error arrives in the stream with its code tagged (the stream asked for it with a request
    parameter, not with `triton_grpc_error`, whose handling crashes tritonserver)."""
    servicer_seen = []

    async def body(client, servicer):
        servicer_seen.append(servicer)
        return [c async for c in client.stream(GenerateSpec(f"invalid {code}"), "r")]

    with pytest.raises(FrontError) as info:
        run(with_fake(body))
    assert (info.value.error_type, info.value.status) == (error_type, status)
    assert info.value.message == "`top_n_tokens` must be >= 0 and <= 5"
    (servicer,) = servicer_seen
    assert servicer.requests[0].parameters["tgi_llm_error_code"].bool_param
    assert not [k for k, _ in servicer.metadata[0] if k == "triton_grpc_error"]


def test_closing_the_stream_cancels_the_triton_call() -> None:
    async def body(client, servicer):
        stream = client.stream(GenerateSpec("slow", {"max_new_tokens": 5}, stream=True), "req-slow")
        first = await stream.__anext__()
        await stream.aclose()
        for _ in range(500):  # the server learns of the cancel asynchronously
            if servicer.cancelled:
                break
            await asyncio.sleep(0.01)
        return first, servicer.cancelled

    first, cancelled = run(with_fake(body))
    assert first.text == " t0"
    assert cancelled == ["req-slow"]


def test_ready() -> None:
    async def body(client, servicer):
        other = TritonGrpcClient(client.url, model_name="nope")
        try:
            return await client.ready(), await other.ready()
        finally:
            await other.close()

    assert run(with_fake(body)) == (True, False)
