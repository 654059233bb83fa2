"""Nothing unauthenticated changes what the server runs: Triton's admin APIs are closed on the public ports
and want the launcher's secret on tritonserver's own (loopback) ones; only our model's unload stops it."""

from __future__ import annotations

import base64
import json
import os
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tgi_llm.launcher.security import ADMIN_HEADER

from .harness import Launched, grpc_generate, http_generate, loopback

pytestmark = [pytest.mark.integration, pytest.mark.slow]

#: The attack from the issue: load a model whose initialize() runs code (here: writes a marker file).
MARKER = Path(tempfile.gettempdir()) / f"tgi-llm-security-test-{os.getpid()}"
MODEL_PY = f"""
class TritonPythonModel:
    def initialize(self, args):
        open({str(MARKER)!r}, "w").write("code ran")

    def execute(self, requests):
        return []
"""
CONFIG = {"backend": "python", "max_batch_size": 0,
          "input": [{"name": "x", "data_type": "TYPE_INT32", "dims": [1]}],
          "output": [{"name": "y", "data_type": "TYPE_INT32", "dims": [1]}]}
LOAD_BODY = {"parameters": {"config": json.dumps(CONFIG),
                            "file:1/model.py": base64.b64encode(MODEL_PY.encode()).decode()}}


def post(url: str, body: dict | None = None, headers: dict | None = None) -> tuple[int, str]:
    data = json.dumps(body or {}).encode()
    request = urllib.request.Request(url, data=data, method="POST",
                                     headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=60) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


ADMIN_HTTP = [
    ("/v2/repository/index", None),
    ("/v2/repository/models/evil/load", LOAD_BODY),
    ("/v2/repository/models/tgi_llm/unload", None),
    ("/v2/systemsharedmemory/region/r/register", {"key": "/triton_python_backend_shm_region_x", "byte_size": 8}),
    ("/v2/trace/setting", {"trace_level": ["TIMESTAMPS"]}),
    ("/v2/logging", {"log_verbose_level": 1}),
]


@pytest.mark.parametrize(("path", "body"), ADMIN_HTTP)
def test_admin_apis_are_closed_on_the_public_http_port_and_want_the_secret_on_tritons(server: Launched, path, body):
    status, text = post(server.http + path, body)
    assert status == 403 and "not served to clients" in text
    # Even with the secret the public port does not forward them.
    secret = loopback(server).admin_secret
    assert post(server.http + path, body, {ADMIN_HEADER: secret})[0] == 403
    status, text = post(loopback(server).http + path, body)
    assert status == 403 and f"expecting header '{ADMIN_HEADER}'" in text
    assert not MARKER.exists()  # no code of the client's ran


def test_admin_apis_are_closed_on_grpc_too(server: Launched):
    for url, code in ((server.grpc, "StatusCode.PERMISSION_DENIED"), (loopback(server).grpc, "StatusCode.UNAVAILABLE")):
        client = grpcclient.InferenceServerClient(url)
        try:
            calls = [(client.get_model_repository_index, ()), (client.load_model, ("evil",)),
                     (client.unload_model, ("tgi_llm",)), (client.get_log_settings, ()),
                     (client.get_system_shared_memory_status, ()), (client.get_trace_settings, ())]
            for call, args in calls:
                with pytest.raises(InferenceServerException) as info:
                    call(*args)
                assert info.value.status() == code
        finally:
            client.close()
    assert server.ready() and not MARKER.exists()
    assert grpc_generate(server, "Hello", max_tokens=2).error is None


def test_only_our_models_unload_stops_the_launcher(server: Launched):
    # What the launcher's secret still allows on the loopback port (the gateway never does): load and unload
    # another model. tritonserver logs "successfully unloaded 'evil'", which must not stop the launcher.
    side = loopback(server)
    admin = {ADMIN_HEADER: side.admin_secret}
    status, text = post(f"{side.http}/v2/repository/models/evil/load", LOAD_BODY, admin)
    assert status == 200, text
    assert post(f"{side.http}/v2/repository/models/evil/unload", None, admin)[0] == 200
    assert "successfully unloaded 'evil'" in _wait_for_line(server, "successfully unloaded 'evil'")
    assert server.process.poll() is None and server.ready()
    assert http_generate(server, {"text_input": "Hello", "max_tokens": 2})[0] == 200
    MARKER.unlink(missing_ok=True)  # that model's initialize ran: the secret allows it, by design


def _wait_for_line(server: Launched, needle: str) -> str:
    from .harness import wait_until

    wait_until(lambda: needle in server.log_path.read_text(errors="replace"), 60)
    return server.log_path.read_text(errors="replace")
