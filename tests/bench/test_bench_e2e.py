"""A tiny benchmark run end to end: the launcher and tritonserver on free 127.0.0.1 ports (stopped at the
end), a random tiny Llama with the real tokenizer, a few requests, every baseline. It shows the tool works
and its files hold the fields; it asserts no timing."""

from __future__ import annotations

import json

import pytest

from tgi_llm.bench.main import main
from tgi_llm.bench.results import ENGINE, SERIAL, STATIC, TRITON_GRPC, TRITON_HTTP

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SMALL = ["--max-batch-total-tokens", "4096", "--max-input-tokens", "256", "--max-total-tokens", "512",
         "--workload", "mixed", "--input-range", "8", "40", "--output-range", "3", "8", "--no-progress"]


def load(out_dir):
    return json.loads((out_dir / "bench.json").read_text()), (out_dir / "bench.md").read_text()


def test_grpc_run_with_every_baseline_writes_json_markdown_and_chart(tiny_llama_dir, tmp_path):
    out = tmp_path / "out"
    code = main(["--launch", "--model-id", str(tiny_llama_dir), "--num-requests", "4", "--concurrency", "2",
                 "--sweep", "1", "2", "--static-batch-size", "2", "--floor-reps", "3", "--out-dir", str(out), *SMALL])
    assert code == 0
    data, md = load(out)
    runs = {(r["system"], r["concurrency"]) for r in data["runs"]}
    assert runs == {(TRITON_GRPC, 1), (TRITON_GRPC, 2), (ENGINE, 1), (ENGINE, 2), (STATIC, None), (SERIAL, None)}
    asked = data["workload"]["output_tokens"]
    for r in data["runs"]:
        assert r["completed"] == 4 and r["failed"] == 0, r["errors"]
        # tokens counted from each stream: exactly what was asked (ignore_eos), and what the server reported
        assert r["output_tokens"] == asked
        assert r["token_count_mismatches"] == 0 and r["length_mismatches"] == 0
        for key in ("output_tokens_per_s", "requests_per_s"):
            assert r[key] > 0
        for key in ("ttft_s", "itl_s", "e2e_s"):
            assert set(r[key]) >= {"p50", "p90", "p99"}
    engine2 = next(r for r in data["runs"] if r["system"] == ENGINE and r["concurrency"] == 2)
    assert any(g["method"] == "decode" for g in engine2["engine_steps"])
    server2 = next(r for r in data["runs"] if r["system"] == TRITON_GRPC and r["concurrency"] == 2)
    assert server2["server_steps"]["decode"]["steps"] > 0
    assert {p["batch_size"] for p in data["floor"]} == {1, 2}
    names = [c["name"] for c in data["comparisons"]]
    assert any("transformers static batch 2" in n for n in names)
    assert any(n.startswith("TTFT p50 at concurrency 1") for n in names)
    assert all(c["value"] is not None for c in data["comparisons"])  # everything was measured
    assert "## Runs" in md and "## Against the targets" in md and "| triton-grpc | 2 |" in md
    assert (out / "bench.png").read_bytes()[:4] == b"\x89PNG"
    assert not (out / "bench.partial.json").exists()  # only left behind by a run that did not finish
    assert "tritonserver stopped" in (out / "launcher.log").read_text()


def test_http_generate_stream_run(tiny_llama_dir, tmp_path):
    out = tmp_path / "out"
    code = main(["--launch", "--protocol", "http", "--model-id", str(tiny_llama_dir), "--num-requests", "3",
                 "--concurrency", "2", "--sweep", "--skip", "engine", "static", "serial", "floor",
                 "--out-dir", str(out), *SMALL])
    assert code == 0
    data, md = load(out)
    (run,) = data["runs"]
    assert (run["system"], run["concurrency"], run["completed"]) == (TRITON_HTTP, 2, 3)
    assert run["output_tokens"] == data["workload"]["output_tokens"]
    assert run["token_count_mismatches"] == 0
    assert "| triton-http | 2 |" in md


def test_multi_turn_with_the_prefix_cache_on_and_off(tiny_llama_dir, tmp_path):
    out = tmp_path / "out"
    code = main(["--launch", "--model-id", str(tiny_llama_dir), "--workload", "multi-turn", "--conversations", "2",
                 "--turns", "2", "--system-tokens", "120", "--question-tokens", "10", "--answer-tokens", "4",
                 "--concurrency", "2", "--compare-off", "prefix-caching", "--max-batch-total-tokens", "4096",
                 "--no-progress", "--out-dir", str(out)])
    assert code == 0
    data, md = load(out)
    on, off = data["runs"]
    assert on["completed"] == off["completed"] == 4 and on["length_mismatches"] == 0
    assert on["server_counters"]["vllm:prefix_cache_hits"] >= 2 * 112  # turn 2 of each: the system prompt
    assert off["server_counters"]["vllm:prefix_cache_queries"] == 0
    assert "## TTFT by turn" in md and "cache off / on" in md
    for mode in ("on", "off"):
        assert "tritonserver stopped" in (out / f"launcher-prefix-caching-{mode}.log").read_text()
