"""Triton model `tgi_llm_trtllm`: tgi_llm with TensorRT-LLM's tensor shapes (tgi_llm/triton/trtllm_forwarder.py)."""

from tgi_llm.triton.trtllm_forwarder import TritonPythonModel  # noqa: F401
