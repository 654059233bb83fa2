"""What the gRPC gateway hands to tritonserver: the client's metadata, with the API key where Triton reads it,
and without `triton_grpc_error` (tritonserver's handling of that mode crashes it; the gateway gives the
status itself)."""

from __future__ import annotations

from tgi_llm.gateway.grpc_proxy import upstream_metadata


def test_authorization_is_renamed_for_tritons_restricted_protocol_check():
    md = upstream_metadata([("authorization", "Bearer k"), ("x-trace", "1"), ("user-agent", "x"),
                            (":authority", "h"), ("trace-bin", b"\x00")])
    assert md == (("triton-grpc-protocol-authorization", "Bearer k"), ("x-trace", "1"))


def test_the_status_header_stays_with_the_gateway():
    assert upstream_metadata([("triton_grpc_error", "true"), ("Triton_GRPC_Error", "true")]) == ()
