"""What the gRPC gateway hands to tritonserver: the client's metadata, with the API key where Triton reads it."""

from __future__ import annotations

from tgi_llm.gateway.grpc_proxy import upstream_metadata


def test_authorization_is_renamed_for_tritons_restricted_protocol_check():
    md = upstream_metadata([("authorization", "Bearer k"), ("triton_grpc_error", "true"), ("user-agent", "x"),
                            (":authority", "h"), ("trace-bin", b"\x00")])
    assert md == (("triton-grpc-protocol-authorization", "Bearer k"), ("triton_grpc_error", "true"))
