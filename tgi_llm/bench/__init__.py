"""The serving benchmark (`tgi-llm-bench`): drive a server over gRPC or HTTP streaming, compare it with
the engine in-process, transformers' static batching and one-at-a-time generation on the same requests,
and with the matmul floor of a decode step, all measured in one run."""
