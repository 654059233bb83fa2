"""Triton model `tgi_llm`: the adapter lives in the tgi_llm package (tgi_llm/triton/model.py)."""

from tgi_llm.triton.model import TritonPythonModel  # noqa: F401
