"""Request sets from the real tokenizer: exact lengths, seeded, and the validation of a spec."""

from __future__ import annotations

import pytest

from tgi_llm.bench.workload import WorkloadSpec, build_workload


@pytest.fixture(scope="module")
def tokenizer(default_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_model_dir)


def test_mixed_lengths_lie_in_their_ranges_and_prompts_tokenize_as_the_engine_does(tokenizer):
    spec = WorkloadSpec("mixed", 40, (1, 600), (3, 9), seed=1)
    requests = build_workload(tokenizer, spec)
    assert [r.index for r in requests] == list(range(40))
    for r in requests:
        assert 1 <= r.input_len <= 600 and 3 <= r.output_len <= 9
        assert tuple(tokenizer(r.prompt, add_special_tokens=True)["input_ids"]) == r.input_ids
    assert len({r.input_len for r in requests}) > 20  # really mixed
    assert len({r.prompt for r in requests}) == 40


def test_fixed_lengths_are_exact(tokenizer):
    requests = build_workload(tokenizer, WorkloadSpec.fixed(8, 128, 16, seed=3))
    assert {r.input_len for r in requests} == {128}
    assert {r.output_len for r in requests} == {16}


def test_same_seed_same_requests_other_seed_other_requests(tokenizer):
    spec = WorkloadSpec("mixed", 6, (10, 300), (5, 50), seed=7)
    assert build_workload(tokenizer, spec) == build_workload(tokenizer, spec)
    other = WorkloadSpec("mixed", 6, (10, 300), (5, 50), seed=8)
    assert build_workload(tokenizer, other) != build_workload(tokenizer, spec)


@pytest.mark.parametrize("kwargs", [
    dict(kind="zipf", num_requests=1, input_len=(1, 1), output_len=(1, 1)),
    dict(kind="mixed", num_requests=1, input_len=(5, 4), output_len=(1, 1)),
    dict(kind="mixed", num_requests=1, input_len=(0, 4), output_len=(1, 1)),
    dict(kind="fixed", num_requests=1, input_len=(1, 2), output_len=(1, 1)),
    dict(kind="mixed", num_requests=0, input_len=(1, 1), output_len=(1, 1)),
])
def test_bad_specs_are_refused(kwargs):
    with pytest.raises(ValueError):
        WorkloadSpec(**kwargs)
