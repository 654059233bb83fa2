"""The grammar mask in the sampler: constrained rows keep exactly the allowed tokens, the others are left
bit for bit as they were."""

from __future__ import annotations

import pytest
import torch

from tgi_llm.engine.grammar import GrammarCompiler, GrammarSpec
from tgi_llm.runner.grammar_mask import GrammarMasker


@pytest.fixture(scope="module")
def tokenizer(default_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_model_dir)


def test_constrained_rows_keep_only_allowed_tokens_and_free_rows_are_untouched(tokenizer):
    vocab = len(tokenizer)
    compiler = GrammarCompiler(tokenizer, vocab, {tokenizer.eos_token_id})
    digits = compiler.compile(GrammarSpec("regex", "[0-9]{2}")).matcher()
    yes_no = compiler.compile(GrammarSpec("regex", "(yes|no)")).matcher()
    logits = torch.randn(4, vocab, generator=torch.Generator().manual_seed(0))
    before = logits.clone()
    masker = GrammarMasker(vocab, frozenset({tokenizer.eos_token_id}))
    masker.mask(logits, [1, 3], [digits, yes_no])
    assert torch.equal(logits[0], before[0]) and torch.equal(logits[2], before[2])
    allowed_digits = {tokenizer.decode([t]) for t in torch.isfinite(logits[1]).nonzero().flatten().tolist()}
    assert allowed_digits and all(text.isdigit() and len(text) <= 2 for text in allowed_digits)
    allowed = torch.isfinite(logits[3]).nonzero().flatten().tolist()
    assert {tokenizer.decode([t]) for t in allowed} <= {"y", "ye", "yes", "n", "no"}
    assert torch.equal(logits[3][allowed], before[3][allowed])  # allowed tokens keep their logits
    assert len(masker.mask_times_s) == 1


def test_a_batch_constrained_in_every_row_is_masked_row_by_row(tokenizer):
    """The in-place path for a fully constrained batch gives each row its own grammar's mask."""
    vocab = len(tokenizer)
    compiler = GrammarCompiler(tokenizer, vocab, {tokenizer.eos_token_id})
    specs = [GrammarSpec("regex", "[0-9]{2}"), GrammarSpec("regex", "(yes|no)")]
    logits = torch.randn(2, vocab, generator=torch.Generator().manual_seed(1))
    before = logits.clone()
    GrammarMasker(vocab, frozenset()).mask(logits, [0, 1], [compiler.compile(s).matcher() for s in specs])
    digits = {tokenizer.decode([t]) for t in torch.isfinite(logits[0]).nonzero().flatten().tolist()}
    words = {tokenizer.decode([t]) for t in torch.isfinite(logits[1]).nonzero().flatten().tolist()}
    assert digits and all(text.isdigit() for text in digits)
    assert words and words <= {"y", "ye", "yes", "n", "no"}
    kept = torch.isfinite(logits)
    assert torch.equal(logits[kept], before[kept])  # allowed tokens keep their logits


def test_the_forced_end_after_a_complete_match_is_reported_done(tokenizer):
    vocab, eos = len(tokenizer), tokenizer.eos_token_id
    matcher = GrammarCompiler(tokenizer, vocab, {eos}).compile(GrammarSpec("regex", "no")).matcher()
    masker = GrammarMasker(vocab, frozenset({eos}))
    (no,) = tokenizer("no", add_special_tokens=False)["input_ids"]
    assert masker.advance([matcher], [[no]]) == [False]  # complete, but the end is its own token
    logits = torch.zeros(1, vocab)
    masker.mask(logits, [0], [matcher])
    assert torch.isfinite(logits[0]).nonzero().flatten().tolist() == [eos]
    assert masker.advance([matcher], [[eos]]) == [True]


def test_a_matcher_that_fails_reports_why_in_one_bounded_line(tokenizer, caplog):
    """A schema that only refers to itself matches nothing: its matcher fails computing the first mask. The
    request must end with that error, not as a success, and the log must not hold the parser's whole state."""
    import llguidance

    vocab, eos = len(tokenizer), tokenizer.eos_token_id
    compiler = GrammarCompiler(tokenizer, vocab, {eos})
    grammar = llguidance.LLMatcher.grammar_from_json_schema('{"$ref": "#"}')
    matcher = llguidance.LLMatcher(compiler._tokenizer(), grammar)  # past compile()'s up-front check
    masker = GrammarMasker(vocab, frozenset({eos}))
    logits = torch.zeros(1, vocab)
    masker.mask(logits, [0], [matcher])
    (outcome,) = masker.advance([matcher], [[int(torch.argmax(logits[0]))]])
    assert isinstance(outcome, str) and outcome.startswith("the grammar cannot be followed: ")
    assert len(outcome) < 300 and "\n" not in outcome
    assert all(len(r.getMessage()) < 400 for r in caplog.records)


def test_a_grammar_that_cannot_be_followed_is_refused_up_front(tokenizer):
    from tgi_llm.errors import ValidationError

    compiler = GrammarCompiler(tokenizer, len(tokenizer), {tokenizer.eos_token_id})
    with pytest.raises(ValidationError, match="^`response_format` cannot be followed: "):
        compiler.compile(GrammarSpec.json_schema({"$ref": "#"}), "response_format")
