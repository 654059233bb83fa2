"""TGI- and OpenAI-compatible HTTP front: FastAPI routes that talk to the Triton model over gRPC streaming."""
