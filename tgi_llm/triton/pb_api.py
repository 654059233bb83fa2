"""The pb_utils side of the adapter: responses, request inputs and metric families.

`pb` is the `triton_python_backend_utils` module, passed in because it exists only inside the stub.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tgi_llm.triton.metrics import FamilyFactory
from tgi_llm.triton.outputs import Outputs
from tgi_llm.triton.status import CodeTaggingSender, tag_error, triton_code


class PbResponses:
    def __init__(self, pb: Any) -> None:
        self.pb = pb

    def send(self, sender: Any, outputs: Outputs | None, error: BaseException | None, final: bool) -> None:
        pb = self.pb
        if error is not None:
            name = triton_code(error)
            message = str(error) or type(error).__name__
            if isinstance(sender, CodeTaggingSender):
                message = tag_error(message, name)
            code = getattr(pb.TritonError, name, pb.TritonError.INTERNAL)
            response = pb.InferenceResponse(error=pb.TritonError(message, code))
        else:
            tensors = [pb.Tensor(name, array) for name, array in (outputs or {}).items()]
            response = pb.InferenceResponse(output_tensors=tensors)
        sender.send(response, flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0)

    def is_cancelled(self, sender: Any) -> bool:
        return bool(sender.is_cancelled())


class PbRequestIO:
    def __init__(self, pb: Any) -> None:
        self.pb = pb

    def tensor(self, request: Any, name: str) -> np.ndarray | None:
        tensor = self.pb.get_input_tensor_by_name(request, name)
        return None if tensor is None else tensor.as_numpy()

    def parameters(self, request: Any) -> str:
        return request.parameters()

    def sender(self, request: Any) -> Any:
        return request.get_response_sender()


def pb_family_factory(pb: Any) -> FamilyFactory:
    kinds = {
        "counter": pb.MetricFamily.COUNTER,
        "gauge": pb.MetricFamily.GAUGE,
        "histogram": pb.MetricFamily.HISTOGRAM,
    }

    def make(name: str, description: str, kind: str) -> Any:
        return pb.MetricFamily(name=name, description=description, kind=kinds[kind])

    return make
