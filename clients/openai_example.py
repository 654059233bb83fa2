"""The official openai SDK against tgi-llm's front (`tgi-llm-launcher --port 3000`), unchanged from OpenAI use.

    .venv/bin/python clients/openai_example.py --url http://localhost:3000 "What is the capital of France?"
"""

from __future__ import annotations

import argparse
import os

from openai import OpenAI


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("prompt", nargs="?", default="What is the capital of France?")
    p.add_argument("--url", default="http://localhost:3000")
    p.add_argument("--api-key", default=os.environ.get("TGI_API_KEY", "-"), help="the launcher's --api-key, if set")
    p.add_argument("--max-tokens", type=int, default=64)
    args = p.parse_args()

    client = OpenAI(base_url=f"{args.url}/v1", api_key=args.api_key)
    messages = [{"role": "user", "content": args.prompt}]

    # Non-streaming; temperature 0 is greedy decoding.
    reply = client.chat.completions.create(model="tgi", messages=messages, max_tokens=args.max_tokens, temperature=0)
    print(reply.choices[0].message.content)
    print(f"[finish_reason={reply.choices[0].finish_reason} usage={reply.usage.model_dump()}]")

    # Streaming, with the token counts in a last chunk.
    stream = client.chat.completions.create(
        model="tgi", messages=messages, max_tokens=args.max_tokens, temperature=0.7, seed=0, stream=True,
        stream_options={"include_usage": True},
    )
    for chunk in stream:
        if chunk.choices:
            print(chunk.choices[0].delta.content or "", end="", flush=True)
        elif chunk.usage:
            print(f"\n[usage={chunk.usage.model_dump()}]")

    # Plain completions.
    done = client.completions.create(model="tgi", prompt="Once upon a time", max_tokens=16, temperature=0)
    print(done.choices[0].text)


if __name__ == "__main__":
    main()
