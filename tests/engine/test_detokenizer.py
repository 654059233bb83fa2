"""IncrementalDetokenizer: streamed deltas concatenate to the full decode, with a bounded window."""

from __future__ import annotations

import random

import pytest
from tokenizers import Tokenizer, decoders
from tokenizers.models import WordLevel

from tgi_llm.engine.detokenizer import IncrementalDetokenizer, _skipped_ids


def _stream(tokenizer, prompt: list[int], generated: list[int], **kwargs) -> tuple[list[str], str]:
    detok = IncrementalDetokenizer(tokenizer, prompt, **kwargs)
    deltas = [detok.step(t) for t in generated]
    tail = detok.finish()
    assert detok.text == "".join(deltas) + tail
    assert detok.generated_ids == generated
    return deltas, tail


def _encode(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def test_ascii_words_each_token_emits_its_text(tokenizer):
    prompt = _encode(tokenizer, "Say something:")
    generated = _encode(tokenizer, "Hello world, this is a test.")
    deltas, tail = _stream(tokenizer, prompt, generated)
    assert tail == ""
    assert deltas == [tokenizer.decode([t]) for t in generated]
    assert "".join(deltas) == "Hello world, this is a test."


def test_leading_space_of_first_token_is_kept(tokenizer):
    prompt = _encode(tokenizer, "Hello")
    generated = _encode(tokenizer, " world again")
    deltas, _ = _stream(tokenizer, prompt, generated)
    assert deltas[0] == " world"
    assert "".join(deltas) == tokenizer.decode(generated) == " world again"


def test_multibyte_characters_split_across_byte_tokens(tokenizer):
    text = "héllo 🤗 世界"
    generated = _encode(tokenizer, text)
    assert len(generated) > len(text.split())  # really split into byte pieces
    deltas, tail = _stream(tokenizer, _encode(tokenizer, "Q:"), generated)
    assert "" in deltas  # held back while a character is incomplete
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) + tail == text
    assert " 🤗" in deltas and "界" in deltas  # emitted whole once the last byte arrives


def test_special_tokens(tokenizer):
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    generated = _encode(tokenizer, "Hi there") + [eos]
    deltas, tail = _stream(tokenizer, [], generated)
    assert deltas[-1] == "" and tail == ""
    assert "".join(deltas) == "Hi there"
    kept, _ = _stream(tokenizer, [], generated, skip_special_tokens=False)
    assert kept[-1] == "<|im_end|>"


def test_prompt_ending_inside_a_character(tokenizer):
    world = _encode(tokenizer, "世")  # several byte tokens
    prompt = _encode(tokenizer, "x") + world[:-1]
    generated = world[-1:] + _encode(tokenizer, " ok")
    deltas, tail = _stream(tokenizer, prompt, generated)
    assert "".join(deltas) + tail == tokenizer.decode(generated, skip_special_tokens=True)


@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_random_token_sequences_concatenate_to_full_decode(tokenizer, skip_special_tokens):
    rng = random.Random(0)
    vocab = len(tokenizer)
    byte_tokens = [i for t, i in tokenizer.get_vocab().items() if len(t) == 1]  # single bytes
    pools = [range(vocab), byte_tokens, range(17)]  # 0..16: SmolLM2's special tokens
    for _ in range(150):
        n = rng.randint(1, 30)
        generated = [rng.choice(pools[rng.choices([0, 1, 2], [5, 4, 1])[0]]) for _ in range(n)]
        prompt = [rng.choice(byte_tokens + list(range(vocab))[:2000]) for _ in range(rng.randint(0, 8))]
        deltas, tail = _stream(tokenizer, prompt, generated, skip_special_tokens=skip_special_tokens)
        expected = tokenizer.decode(generated, skip_special_tokens=skip_special_tokens)
        assert "".join(deltas) + tail == expected, (prompt, generated)


class _CountingTokenizer:
    """Wraps a tokenizer and records how many ids each decode call gets."""

    def __init__(self, tokenizer):
        self._tokenizer = tokenizer
        self.window_sizes: list[int] = []
        self.all_special_ids = tokenizer.all_special_ids  # what a slow tokenizer's decode skips

    def decode(self, ids, skip_special_tokens=False, clean_up_tokenization_spaces=None):
        self.window_sizes.append(len(ids))
        return self._tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)


def test_each_step_decodes_a_short_window(tokenizer):
    counting = _CountingTokenizer(tokenizer)
    generated = _encode(tokenizer, "The quick brown fox jumps over the lazy dog. 世界 " * 30)
    deltas, tail = _stream(counting, _encode(tokenizer, "Go:"), generated)
    assert "".join(deltas) + tail == tokenizer.decode(generated)
    assert len(generated) > 300
    assert max(counting.window_sizes) <= 8  # independent of the output length
    assert len(counting.window_sizes) <= 2 * len(generated) + 2


def test_a_run_of_skipped_special_tokens_keeps_the_window_short(tokenizer):
    # ignore_eos past the end: EOS after EOS adds no text, and must not make each step decode the whole run.
    counting = _CountingTokenizer(tokenizer)
    eos = tokenizer.eos_token_id
    generated = _encode(tokenizer, "The end.") + [eos] * 2000 + _encode(tokenizer, " More 世界 text")
    deltas, tail = _stream(counting, _encode(tokenizer, "Go:"), generated)
    assert "".join(deltas) + tail == tokenizer.decode(generated, skip_special_tokens=True)
    assert max(counting.window_sizes) <= 8
    assert len(counting.window_sizes) <= 2 * (len(generated) - 2000) + 2  # the skipped ones decode nothing


def test_specials_kept_when_not_skipped_still_decode_in_short_windows(tokenizer):
    counting = _CountingTokenizer(tokenizer)
    generated = [tokenizer.eos_token_id] * 500
    deltas, tail = _stream(counting, [], generated, skip_special_tokens=False)
    assert "".join(deltas) + tail == tokenizer.decode(generated, skip_special_tokens=False)
    assert max(counting.window_sizes) <= 8


def test_the_ids_left_out_of_the_window_are_those_decoding_drops(tokenizer):
    skipped = _skipped_ids(tokenizer)
    assert tokenizer.eos_token_id in skipped and len(skipped) >= len(tokenizer.all_special_ids)
    word = _encode(tokenizer, " word")
    for token_id in range(len(tokenizer)):
        dropped = tokenizer.decode(word + [token_id] + word, skip_special_tokens=True) == " word word"
        assert dropped == (token_id in skipped), token_id


def test_metaspace_leading_space_survives_thanks_to_prompt_context():
    # SentencePiece-style decoding strips the first token's leading space; TGI keeps it.
    tok = Tokenizer(WordLevel({"<unk>": 0, "▁Hello": 1, "▁world": 2, "!": 3}, unk_token="<unk>"))
    tok.decoder = decoders.Metaspace()
    assert tok.decode([2, 3]) == "world!"
    deltas, tail = _stream(tok, [1], [2, 3])
    assert deltas == [" world", "!"] and tail == ""
