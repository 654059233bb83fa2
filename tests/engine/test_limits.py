import pytest

from tgi_llm.engine.limits import LimitOptions, resolve_limits, resolve_max_total_tokens
from tgi_llm.errors import ArgumentValidationError


def test_defaults_follow_tgi():
    lim = resolve_limits(LimitOptions(), max_position_embeddings=8192, kv_cache_tokens=100_000)
    assert lim.max_total_tokens == 4096  # TGI caps the default context at 4096
    assert lim.max_input_tokens == 4095
    assert lim.max_batch_prefill_tokens == 4145
    assert lim.max_batch_total_tokens == 100_000 - 100_000 % 16
    assert lim.num_blocks == lim.max_batch_total_tokens // 16


def test_small_model_context_bounds_default():
    lim = resolve_limits(LimitOptions(), max_position_embeddings=512, kv_cache_tokens=10_000)
    assert (lim.max_input_tokens, lim.max_total_tokens) == (511, 512)


@pytest.mark.parametrize(
    "opts, message",
    [
        (LimitOptions(max_input_tokens=2048, max_total_tokens=1024),
         r"`max_input_tokens`\(2048\) must be < `max_total_tokens`\(1024\)"),
        (LimitOptions(max_input_tokens=1000, max_total_tokens=2000, max_batch_prefill_tokens=500,
                      prefill_chunking=False),
         r"`max_batch_prefill_tokens` must be >= `max_input_tokens`. Given: 500 and 1000"),
        (LimitOptions(max_batch_prefill_tokens=9000, max_batch_total_tokens=8000),
         r"`max_batch_prefill_tokens` must be <= `max_batch_total_tokens`. Given: 9000 and 8000"),
        (LimitOptions(max_total_tokens=4096, max_batch_total_tokens=2048, max_input_tokens=100,
                      max_batch_prefill_tokens=200),
         r"`max_total_tokens` must be <= `max_batch_total_tokens`. Given: 4096 and 2048"),
        (LimitOptions(max_concurrent_requests=0), r"`max_concurrent_requests` must be > 0. Given: 0"),
        (LimitOptions(max_batch_size=0), r"`max_batch_size` must be > 0. Given: 0"),
    ],
)
def test_bad_combinations_name_both_values(opts, message):
    with pytest.raises(ArgumentValidationError, match=message):
        resolve_limits(opts, max_position_embeddings=8192, kv_cache_tokens=100_000)


def test_kv_budget_too_small_for_one_request_names_max_total_tokens_not_the_prefill_budget_derived_from_it():
    """The builder names the bytes first (test_builder.py); called alone, TGI's check on the pool says it."""
    for chunking in (True, False):
        with pytest.raises(ArgumentValidationError,
                           match=r"`max_total_tokens` must be <= `max_batch_total_tokens`. Given: 4096 and 992"):
            resolve_limits(LimitOptions(prefill_chunking=chunking), max_position_embeddings=8192,
                           kv_cache_tokens=992)


@pytest.mark.parametrize(("asked", "context", "resolved"), [
    ({}, 8192, 4096),  # TGI's default
    ({}, 1024, 1024),  # the model's context where shorter: max_position_embeddings 256 x --rope-factor 4
    ({"max_input_tokens": 100}, 8192, 4096),
    ({"max_input_tokens": 40000}, 8192, 40001),
    ({"max_total_tokens": 32768, "max_input_tokens": 32000}, 8192, 32768),
])
def test_the_longest_request_resolves_as_resolve_limits_resolves_it(asked, context, resolved):
    opts = LimitOptions(**asked)
    assert resolve_max_total_tokens(opts, context) == resolved
    assert resolve_limits(opts, context, 100_000).max_total_tokens == resolved


def test_a_context_past_what_the_model_allows_is_served_with_a_warning_as_tgi_does(caplog):
    opts = LimitOptions(max_input_tokens=32000, max_total_tokens=32768)
    assert resolve_limits(opts, 8192, 40_000).max_total_tokens == 32768
    assert "exceeds the 8192 positions the model allows" in caplog.text and "--rope-factor" in caplog.text
    caplog.clear()
    resolve_limits(opts, 8192 * 4, 40_000)  # --rope-factor 4
    assert "exceeds" not in caplog.text


def test_derived_prefill_budget_shrinks_to_fit_cache():
    lim = resolve_limits(LimitOptions(max_total_tokens=1024), max_position_embeddings=8192, kv_cache_tokens=1040)
    assert lim.max_batch_prefill_tokens <= lim.max_batch_total_tokens
    assert lim.max_batch_prefill_tokens >= lim.max_input_tokens


def test_with_chunking_the_step_budget_defaults_to_the_devices():
    lim = resolve_limits(LimitOptions(), 8192, 100_000, default_step_tokens=512)
    assert (lim.max_batch_prefill_tokens, lim.max_input_tokens) == (512, 4095)
    explicit = resolve_limits(LimitOptions(max_batch_prefill_tokens=2048), 8192, 100_000, default_step_tokens=512)
    assert explicit.max_batch_prefill_tokens == 2048
    whole = resolve_limits(LimitOptions(prefill_chunking=False), 8192, 100_000, default_step_tokens=512)
    assert whole.max_batch_prefill_tokens == 4145  # TGI's: the longest prompt must fit one step
