"""Each TGI validation rule rejects with its own message naming the field and the limit."""

import pytest

from tgi_llm.engine.limits import LimitOptions, resolve_limits
from tgi_llm.engine.validation import Validator
from tgi_llm.errors import ValidationError


class CharTokenizer:
    """One token per character: lengths in these tests are easy to read."""

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": [ord(c) % 100 for c in text]}

    def __len__(self):
        return 100


@pytest.fixture
def validator():
    lim = resolve_limits(
        LimitOptions(max_input_tokens=10, max_total_tokens=20, max_batch_prefill_tokens=64,
                     max_batch_total_tokens=256, max_stop_sequences=2, max_top_n_tokens=3),
        max_position_embeddings=None, kv_cache_tokens=None,
    )
    return Validator(CharTokenizer(), lim)


@pytest.mark.parametrize(
    "inputs, params, message",
    [
        ("", {}, "`inputs` cannot be empty"),
        ([], {}, "`inputs` cannot be empty"),
        ("x" * 11, {}, "`inputs` must have less than 10 tokens. Given: 11"),
        ("hello", {"max_new_tokens": 16},
         "`inputs` tokens + `max_new_tokens` must be <= 20. Given: 5 `inputs` tokens and 16 `max_new_tokens`"),
        ("hi", {"max_new_tokens": 0}, "`max_new_tokens` must be strictly positive"),
        ("hi", {"temperature": 0.0}, "`temperature` must be strictly positive"),
        ("hi", {"top_p": 1.5}, "`top_p` must be > 0.0 and < 1.0"),
        ("hi", {"top_p": 0.0}, "`top_p` must be > 0.0 and < 1.0"),
        ("hi", {"typical_p": 0.0}, "`typical_p` must be > 0.0 and < 1.0"),
        ("hi", {"top_k": 0}, "`top_k` must be strictly positive"),
        ("hi", {"repetition_penalty": 0.0}, "`repetition_penalty` must be strictly positive"),
        ("hi", {"frequency_penalty": 2.5}, "`frequency_penalty` must be >= -2.0 and <= 2.0"),
        ("hi", {"presence_penalty": -2.5}, "`presence_penalty` must be >= -2.0 and <= 2.0"),
        ("hi", {"stop": ["a", "b", "c"]}, "`stop` supports up to 2 stop sequences. Given: 3"),
        ("hi", {"top_n_tokens": 4}, "`top_n_tokens` must be >= 0 and <= 3. Given: 4"),
        ("hi", {"truncate": 0}, "`truncate` must be strictly positive and less than 10. Given: 0"),
        ("hi", {"truncate": 11}, "`truncate` must be strictly positive and less than 10. Given: 11"),
        ("hi", {"best_of": 3}, "`best_of` must be > 0 and <= 2. Given: 3"),
        ("hi", {"best_of": 2}, "`best_of` != 1 is not allowed for this endpoint"),
        ("hi", {"decoder_input_details": True, "stream": True},
         "`decoder_input_details` == true is not supported when streaming tokens"),
        ("hi", {"grammar": {"type": "json"}}, "grammar is not supported"),
        ("hi", {"top_p": "high"}, "`top_p` must be a number"),
        ("hi", {"temperature": float("nan")}, "`temperature` must be a finite number. Given: nan"),
        ("hi", {"top_p": float("nan")}, "`top_p` must be a finite number"),
        ("hi", {"typical_p": float("nan")}, "`typical_p` must be a finite number"),
        ("hi", {"temperature": float("inf")}, "`temperature` must be a finite number. Given: inf"),
        ("hi", {"repetition_penalty": float("-inf")}, "`repetition_penalty` must be a finite number"),
        ("hi", {"frequency_penalty": float("nan")}, "`frequency_penalty` must be a finite number"),
        ("hi", {"presence_penalty": float("nan")}, "`presence_penalty` must be a finite number"),
        ("hi", {"temperature": 10**400}, "`temperature` must be a finite number"),
        ("hi", {"max_new_tokens": 1.5}, "`max_new_tokens` must be an integer"),
        ("hi", {"do_sample": "yes"}, "`do_sample` must be a boolean"),
        ("hi", {"seed": -1}, "`seed` must be >= 0"),
        ([5, 500], {}, "`inputs` token ids must be integers in [0, 100). Given: 500"),
    ],
)
def test_rule_rejects_with_its_message(validator, inputs, params, message):
    with pytest.raises(ValidationError) as err:
        validator.validate(inputs, params)
    assert message in str(err.value)


def test_absent_max_new_tokens_means_up_to_the_limit(validator):
    assert validator.validate("hello").stopping.max_new_tokens == 15


def test_truncate_keeps_the_end_of_the_prompt(validator):
    req = validator.validate("x" * 8 + "ab", {"truncate": 2, "max_new_tokens": 1})
    assert req.input_ids == (ord("a") % 100, ord("b") % 100)


def test_truncate_lets_a_long_prompt_through(validator):
    assert validator.validate("y" * 30, {"truncate": 5, "max_new_tokens": 1}).input_length == 5


def test_warpers_imply_sampling_as_in_tgi(validator):
    assert not validator.validate("hi").sampling.do_sample
    assert validator.validate("hi", {"top_k": 5}).sampling.do_sample
    assert validator.validate("hi", {"temperature": 0.5}).sampling.do_sample
    assert validator.validate("hi", {"do_sample": True}).sampling.do_sample
    assert not validator.validate("hi", {"top_p": 1.0}).sampling.do_sample


def test_seed_is_kept_or_drawn(validator):
    assert validator.validate("hi", {"seed": 42}).sampling.seed == 42
    seeds = {validator.validate("hi").sampling.seed for _ in range(4)}
    assert len(seeds) > 1


def test_stop_accepts_a_single_string_and_drops_empty_ones(validator):
    assert validator.validate("hi", {"stop": "\n"}).stopping.stop_sequences == ("\n",)
    assert validator.validate("hi", {"stop": ["", "x"]}).stopping.stop_sequences == ("x",)


class CountingTokenizer:
    """The real tokenizer, counting the characters it is asked to tokenize."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.chars = 0

    def __call__(self, text, add_special_tokens=True):
        self.chars += len(text)
        return self.tokenizer(text, add_special_tokens=add_special_tokens)

    def __len__(self):
        return len(self.tokenizer)

    def get_vocab(self):
        return self.tokenizer.get_vocab()


@pytest.fixture
def counting(tokenizer):
    lim = resolve_limits(LimitOptions(max_input_tokens=100, max_total_tokens=200, max_batch_prefill_tokens=256,
                                      max_batch_total_tokens=1024), max_position_embeddings=None, kv_cache_tokens=None)
    counting = CountingTokenizer(tokenizer)
    return Validator(counting, lim), counting


def test_a_huge_prompt_is_refused_from_its_length_without_tokenizing(counting):
    validator, tokenizer = counting
    longest = validator.max_token_chars
    assert longest == max(len(t) for t in tokenizer.get_vocab())  # 81 for SmolLM2
    with pytest.raises(ValidationError) as info:
        validator.validate("word " * 10_000_000)  # 50 MB
    assert str(info.value).startswith("`inputs` must have less than 100 tokens. Given: 50000000 characters")
    assert tokenizer.chars == 0
    # Just under the bound it is tokenized, and refused by its real token count as TGI does.
    with pytest.raises(ValidationError, match="`inputs` must have less than 100 tokens. Given: "):
        validator.validate("w" * (100 * longest))
    assert tokenizer.chars == 100 * longest


def test_with_truncate_only_the_prompts_end_is_tokenized_and_kept_tokens_match(counting):
    validator, tokenizer = counting
    prompt = " ".join(f"word{i}" for i in range(200_000))  # ~1.5 MB of ordinary text
    got = validator.validate(prompt, {"truncate": 50, "max_new_tokens": 5})
    assert tokenizer.chars <= (50 + 16) * validator.max_token_chars
    whole = tokenizer.tokenizer(prompt, add_special_tokens=True)["input_ids"]
    assert list(got.input_ids) == whole[-50:]
    assert got.input_text == prompt  # return_full_text still returns the whole prompt


def test_tiny_temperatures_and_repetition_penalties_are_clamped_not_divided_by(validator):
    """The sampler divides logits by both: over 1e-38 a float32 logit is infinite and the distribution NaN."""
    request = validator.validate("hi", {"temperature": 1e-38, "repetition_penalty": 1e-38})
    assert request.sampling.temperature == 1e-5 and request.sampling.repetition_penalty == 1e-5
    assert validator.validate("hi", {"temperature": 0.5}).sampling.temperature == 0.5
