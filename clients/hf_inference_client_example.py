"""huggingface_hub's InferenceClient against tgi-llm's front, exactly as against TGI.

    .venv/bin/python clients/hf_inference_client_example.py --url http://localhost:3000 "Tell me a joke"
"""

from __future__ import annotations

import argparse
import os

from huggingface_hub import InferenceClient


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("prompt", nargs="?", default="Tell me a joke")
    p.add_argument("--url", default="http://localhost:3000")
    p.add_argument("--api-key", default=os.environ.get("TGI_API_KEY"), help="the launcher's --api-key, if set")
    p.add_argument("--max-new-tokens", type=int, default=48)
    args = p.parse_args()

    client = InferenceClient(model=args.url, api_key=args.api_key)

    # Token by token, with details on the last event.
    for event in client.text_generation(args.prompt, max_new_tokens=args.max_new_tokens, details=True, stream=True):
        print(event.token.text, end="", flush=True)
        if event.details is not None:
            print(f"\n[finish_reason={event.details.finish_reason} tokens={event.details.generated_tokens}]")

    # All at once, with per-token logprobs and the 2 most likely alternatives of each token.
    out = client.text_generation(args.prompt, max_new_tokens=8, details=True, top_n_tokens=2)
    print(out.generated_text)
    for token in out.details.tokens:
        print(f"  {token.id:>6} {token.text!r:>14} {token.logprob:.3f}")

    # The chat template of the model renders the messages.
    reply = client.chat_completion([{"role": "user", "content": args.prompt}], max_tokens=32, temperature=0)
    print(reply.choices[0].message.content)


if __name__ == "__main__":
    main()
