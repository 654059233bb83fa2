"""`--dtype bfloat16` served by a real tritonserver: the default GGUF keeps its codes (bfloat16 products from
16 rows, float32 below), a lone request gives the in-process engine's greedy text, and a batch wider than
16 rows (where the bfloat16 products take the decode steps too) ends every request with exactly one final
response of the length asked."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from tgi_llm.quant.kernels import quant_kernels

from .conftest import SERVER_FLAGS, serving
from .harness import grpc_generate, http_generate

PROMPT = "The three primary colors of light are red, green and blue. Each one"


@pytest.fixture(scope="module")
def bf16_server(tmp_path_factory):
    kernels = quant_kernels()
    if kernels is None or kernels.amx:
        pytest.skip("the codes keep bfloat16 products where the C kernels serve and AMX does not")
    yield from serving(tmp_path_factory.mktemp("bf16"), *SERVER_FLAGS, "--dtype", "bfloat16")


def test_bfloat16_server_keeps_the_codes_and_matches_the_engine_alone(bf16_server):
    from tgi_llm import LLM

    log = bf16_server.log_path.read_text(errors="replace")
    assert "with bfloat16 products in the linears from 16 rows" in log and "weights gguf" in log
    with LLM(dtype="bfloat16", max_input_tokens=512, max_total_tokens=1024, max_batch_total_tokens=4096) as llm:
        want = llm.generate([PROMPT], {"max_new_tokens": 16})[0].text
    status, body = http_generate(bf16_server, {"text_input": PROMPT, "max_tokens": 16})
    assert status == 200 and body["text_output"] == want


def test_bfloat16_server_batch_past_16_rows_ends_each_request_once(bf16_server):
    prompts = [f"{PROMPT} (variant {i}):" for i in range(20)]
    with ThreadPoolExecutor(len(prompts)) as pool:
        replies = list(pool.map(lambda p: grpc_generate(bf16_server, p, max_tokens=24, ignore_eos=True), prompts))
    for reply in replies:
        assert reply.error is None
        assert reply.finals.count(True) == 1 and reply.finals[-1] is True
        assert reply.finish_reason == "length" and reply.num_output_tokens == 24
        assert reply.text.strip()
