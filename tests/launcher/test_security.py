"""tritonserver's restricted-API flags: admin APIs behind the launcher's secret, inference behind --api-key."""

from __future__ import annotations

from tgi_llm.launcher.security import ADMIN_HEADER, Restrictions


def test_admin_apis_want_a_fresh_secret_on_both_protocols():
    one, two = Restrictions.new(None), Restrictions.new(None)
    assert one.admin_secret != two.admin_secret and len(one.admin_secret) >= 32
    spec = f"model-repository,shared-memory,trace,logging:{ADMIN_HEADER}={one.admin_secret}"
    assert one.triton_args() == [f"--http-restricted-api={spec}", f"--grpc-restricted-protocol={spec}"]
    assert one.grpc_client_metadata() == ()


def test_api_key_guards_inference_metadata_config_and_statistics_not_health():
    r = Restrictions.new("k3y")
    keyed = [a for a in r.triton_args() if "authorization=" in a]
    assert keyed == ["--http-restricted-api=inference,metadata,model-config,statistics:authorization=Bearer k3y",
                     "--grpc-restricted-protocol=inference,metadata,model-config,statistics:authorization=Bearer k3y"]
    assert not any("health" in a for a in r.triton_args())
    assert r.grpc_client_metadata() == (("triton-grpc-protocol-authorization", "Bearer k3y"),)
