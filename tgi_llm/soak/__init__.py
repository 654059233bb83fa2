"""A soak run: many requests over Triton gRPC, Triton HTTP and the OpenAI front, some cancelled, some
invalid, checked for exactly one final response each, no KV blocks or memory left behind, and the
server's metrics against what was sent (tools/soak, docs/RELIABILITY.md)."""
