"""The Triton Python-backend adapter over the engine: tensors in, events out, TGI's metrics.

model_repository/tgi_llm/1/model.py re-exports `tgi_llm.triton.model.TritonPythonModel`; everything
else here is plain Python that the unit tests drive without Triton.
"""
