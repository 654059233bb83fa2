"""The small soak CI runs: tools/soak against its own launched server (the default model, with its front),
200 requests over gRPC, Triton HTTP and the OpenAI front, ~20% cancelled, ~5% invalid."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


def test_a_200_request_soak_passes_every_check(tmp_path, default_model_dir):
    out = tmp_path / "soak.json"
    done = subprocess.run([sys.executable, "tools/soak", "--launch", "--num-requests", "200", "--concurrency", "6",
                           "--time-limit-s", "900", "--json", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=1500)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    report = json.loads(out.read_text())
    assert report["passed"] and report["sent"] == 200
    assert set(report["by_protocol"]) == {"grpc", "http", "openai"}
    counts = report["by_protocol"].values()
    assert sum(c.get("cancel", 0) for c in counts) > 20 and sum(c.get("invalid", 0) for c in counts) > 3
    assert report["server"]["tgi_request_count"] == 200
    assert report["kv_blocks"]["tgi_kv_blocks_free"] == report["kv_blocks"]["tgi_kv_blocks_total"] > 0
    assert len(report["rss_curve"]) >= 3
