"""Stream tokens from the tgi_llm Triton model over gRPC with tritonclient.

    python clients/triton_grpc_stream.py "What is deep learning?" --max-tokens 64 --url 127.0.0.1:8001

Each response carries one token's text delta in `text_output`; the last one is flagged final and
carries `finish_reason` and the token counts. Ctrl-C cancels the request on the server (its KV
blocks are freed within a step). TGI parameters the model has no tensor for travel as request
parameters (e.g. --param repetition_penalty=1.2).
"""

from __future__ import annotations

import argparse
import json
import queue
import sys

import numpy as np
import tritonclient.grpc as grpcclient


def tensor(name: str, value: np.ndarray, dtype: str) -> grpcclient.InferInput:
    t = grpcclient.InferInput(name, list(value.shape), dtype)
    t.set_data_from_numpy(value)
    return t


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("prompt")
    parser.add_argument("--url", default="127.0.0.1:8001", help="Triton gRPC host:port")
    parser.add_argument("--model", default="tgi_llm")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=None, help="sample (default: greedy)")
    parser.add_argument("--param", action="append", default=[], metavar="NAME=JSON",
                        help="a TGI parameter sent as a Triton request parameter")
    args = parser.parse_args()

    inputs = [
        tensor("text_input", np.array([args.prompt.encode()], dtype=np.object_), "BYTES"),
        tensor("stream", np.array([True]), "BOOL"),
        tensor("max_tokens", np.array([args.max_tokens], dtype=np.int32), "INT32"),
    ]
    if args.temperature is not None:
        inputs.append(tensor("temperature", np.array([args.temperature], dtype=np.float32), "FP32"))
    parameters = {}
    for item in args.param:
        name, _, raw = item.partition("=")
        parameters[name] = json.loads(raw)

    responses: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(args.url)
    # `triton_grpc_error: true` makes errors arrive with their status code (INVALID_ARGUMENT, UNAVAILABLE...).
    client.start_stream(callback=lambda result, error: responses.put((result, error)),
                        headers={"triton_grpc_error": "true"})
    try:
        client.async_stream_infer(args.model, inputs, parameters=parameters or None)
        while True:
            result, error = responses.get()
            if error is not None:
                print(f"\nerror ({error.status()}): {error.message()}", file=sys.stderr)
                return 1
            print(result.as_numpy("text_output")[0].decode(), end="", flush=True)
            if result.get_response().parameters["triton_final_response"].bool_param:
                reason = result.as_numpy("finish_reason")[0].decode()
                n_in, n_out = result.as_numpy("num_input_tokens")[0], result.as_numpy("num_output_tokens")[0]
                print(f"\n[finish_reason={reason} input_tokens={n_in} generated_tokens={n_out}]", file=sys.stderr)
                return 0
    except KeyboardInterrupt:
        client.stop_stream(cancel_requests=True)
        print("\n[cancelled]", file=sys.stderr)
        return 130
    finally:
        client.stop_stream()
        client.close()


if __name__ == "__main__":
    raise SystemExit(main())
