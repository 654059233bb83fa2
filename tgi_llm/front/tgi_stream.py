"""TGI's /generate_stream events from Triton responses: one StreamResponse per token, and the last one
carries generated_text (and details when asked).

Triton may send the final response (finish reason, counts) after the last token's, on its own. TGI's
clients read the end from the last token's event, so a token that is probably the last (a special token
such as EOS, the max_new_tokens-th token, text that hits a stop sequence) is held until the next response
says whether it ended the request. Other tokens go out at once: no latency is added to them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from tgi_llm.front.errors import FrontError
from tgi_llm.front.protocol import Chunk, TokenInfo
from tgi_llm.front.schemas import GenerateParameters, StreamDetails, StreamResponse, Token
from tgi_llm.front.sse import error_event, event


def _token(t: TokenInfo) -> Token:
    return Token(id=t.id, text=t.text, logprob=t.logprob, special=t.special)


class _Events:
    """Per stream. Per token it does work bounded by that token's text: the text so far is kept as parts,
    joined once at the end, and stop sequences are looked for only where the new text could complete one."""

    def __init__(self, params: GenerateParameters, prompt: str) -> None:
        self.params = params
        self.parts = [prompt] if params.return_full_text else []
        self.index = 0
        self.stops = [s for s in ([params.stop] if isinstance(params.stop, str) else params.stop or []) if s]
        self._keep = max((len(s) for s in self.stops), default=1) - 1  # a match's start before the new text
        self._tail = ""  # the last `_keep` characters generated
        self.hit_stop = False  # a stop sequence occurs in the generated text (stays so)

    def tokens(self, chunk: Chunk) -> list[StreamResponse]:
        self.parts.append(chunk.text)
        if self.stops and chunk.text and not self.hit_stop:
            window = self._tail + chunk.text
            self.hit_stop = any(stop in window for stop in self.stops)
            self._tail = window[max(len(window) - self._keep, 0):] if self._keep else ""
        tokens = chunk.tokens or ([TokenInfo(id=0, text=chunk.text, logprob=None)] if chunk.text else [])
        out = []
        for i, tok in enumerate(tokens):
            self.index += 1
            tops = chunk.top_tokens[i] if i < len(chunk.top_tokens) else []
            out.append(StreamResponse(index=self.index, token=_token(tok), top_tokens=[_token(t) for t in tops]))
        return out

    def maybe_last(self, response: StreamResponse) -> bool:
        limit = self.params.max_new_tokens
        return (
            response.token.special
            or (limit is not None and self.index >= limit)
            or self.hit_stop
        )

    def finish(self, response: StreamResponse, final: Chunk) -> StreamResponse:
        response.generated_text = "".join(self.parts)
        if self.params.details:
            response.details = StreamDetails(
                finish_reason=final.finish_reason or "length",
                generated_tokens=final.generated_tokens if final.generated_tokens is not None else self.index,
                seed=final.seed,
                input_length=final.input_tokens or 0,
                cached_tokens=final.cached_tokens or 0,
                accepted_draft_tokens=final.accepted_draft_tokens or 0,
            )
        return response


async def tgi_events(
    params: GenerateParameters, prompt: str, first: Chunk, rest: AsyncIterator[Chunk]
) -> AsyncIterator[bytes]:
    state = _Events(params, prompt)
    held: StreamResponse | None = None
    try:
        chunk: Chunk | None = first
        while chunk is not None:
            new = state.tokens(chunk)
            if chunk.final:
                if new:
                    new[-1] = state.finish(new[-1], chunk)
                elif held is not None:
                    held = state.finish(held, chunk)
                else:  # nothing generated to attach the end to: an empty special token carries it
                    new = [state.finish(StreamResponse(index=state.index + 1, token=Token(
                        id=0, text="", logprob=None, special=True)), chunk)]
                for response in ([held] if held is not None else []) + new:
                    yield event(response.model_dump())
                return
            if new and held is not None:
                yield event(held.model_dump())
                held = None
            for response in new[:-1]:
                yield event(response.model_dump())
            if new:
                if state.maybe_last(new[-1]):
                    held = new[-1]
                else:
                    yield event(new[-1].model_dump())
            chunk = await anext(rest, None)
        if held is not None:
            yield event(held.model_dump())
        yield error_event(FrontError("Incomplete generation", "incomplete_generation"))
    except FrontError as err:
        if held is not None:
            yield event(held.model_dump())
        yield error_event(err)
    finally:
        await rest.aclose()
