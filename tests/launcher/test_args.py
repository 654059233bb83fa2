"""TGI's flags, their environment variables and start-up checks, with TGI's messages."""

from __future__ import annotations

import pytest

from tgi_llm.engine.options import EngineOptions
from tgi_llm.errors import ArgumentValidationError
from tgi_llm.launcher.args import model_parameters, parse_args, validate
from tgi_llm.models.rope_override import RopeOverride


def check(argv: list[str], env: dict[str, str] | None = None):
    return validate(parse_args(argv, env or {}))


def test_defaults_are_tgi_and_triton_defaults():
    args = check([])
    assert (args.http_port, args.grpc_port, args.metrics_port) == (8000, 8001, 8002)
    assert args.max_concurrent_requests == 128 and args.max_waiting_tokens == 20
    assert args.waiting_served_ratio == 0.3 and args.num_shard == 1
    assert args.json_output is False and args.model_id is None


def test_environment_variables_and_flags_over_them():
    env = {"MAX_INPUT_TOKENS": "100", "MAX_TOTAL_TOKENS": "200", "JSON_OUTPUT": "true", "MODEL_ID": "m",
           "HTTP_PORT": "9000"}
    args = check([], env)
    assert (args.max_input_tokens, args.max_total_tokens, args.json_output, args.model_id) == (100, 200, True, "m")
    assert args.http_port == 9000
    assert check(["--max-input-tokens", "150"], env).max_input_tokens == 150


def test_switches_take_an_optional_value():
    assert parse_args(["--json-output"], {}).json_output is True
    assert parse_args(["--json-output", "false"], {}).json_output is False


def test_prefix_caching_and_chunking_default_on_and_turn_off_by_flag_or_env():
    args = parse_args([], {})
    assert args.prefix_caching is True and args.prefill_chunking is True
    assert parse_args(["--no-prefix-caching"], {}).prefix_caching is False
    assert parse_args(["--prefix-caching", "false"], {}).prefix_caching is False
    off = parse_args([], {"PREFIX_CACHING": "0", "PREFILL_CHUNKING": "false"})
    assert off.prefix_caching is False and off.prefill_chunking is False
    assert parse_args(["--prefill-chunking"], {"PREFILL_CHUNKING": "0"}).prefill_chunking is True
    params = model_parameters(check(["--no-prefix-caching"]), "/m")
    assert params["prefix_caching"] == "False" and params["prefill_chunking"] == "True"


def test_scheduling_policy_by_flag_or_env_reaches_the_model_and_only_known_ones_pass():
    assert parse_args([], {}).scheduling_policy == "shortest-prompt"
    assert model_parameters(check([], {"SCHEDULING_POLICY": "fcfs"}), "/m")["scheduling_policy"] == "fcfs"
    with pytest.raises(SystemExit):
        parse_args(["--scheduling-policy", "lifo"], {})


def test_kv_cache_dtype_by_flag_or_env_reaches_the_model_and_only_known_ones_pass():
    assert model_parameters(check([]), "/m")["kv_cache_dtype"] == "auto"
    assert model_parameters(check(["--kv-cache-dtype", "bfloat16"]), "/m")["kv_cache_dtype"] == "bfloat16"
    assert model_parameters(check([], {"KV_CACHE_DTYPE": "float16"}), "/m")["kv_cache_dtype"] == "float16"
    assert model_parameters(check(["--kv-cache-dtype", "int8"]), "/m")["kv_cache_dtype"] == "int8"
    with pytest.raises(SystemExit):
        parse_args(["--kv-cache-dtype", "int3"], {})


def rope(argv: list[str], env: dict[str, str] | None = None):
    """The rope override the model process builds from the launcher's config parameters."""
    return EngineOptions.from_parameters(model_parameters(check(argv, env), "/m")).rope_override


def test_rope_flags_pair_as_tgi_pairs_them_and_reach_the_model():
    assert rope([]) is None
    assert rope(["--rope-scaling", "dynamic", "--rope-factor", "4"]) == RopeOverride("dynamic", 4.0)
    assert rope(["--rope-factor", "2.5"]) == RopeOverride("linear", 2.5)  # a factor alone: linear
    assert rope(["--rope-scaling", "dynamic"]) == RopeOverride("dynamic", 1.0)  # a scaling alone: factor 1
    assert rope([], {"ROPE_SCALING": "dynamic", "ROPE_FACTOR": "8"}) == RopeOverride("dynamic", 8.0)
    assert rope(["--rope-factor", "2"], {"ROPE_FACTOR": "8"}) == RopeOverride("linear", 2.0)


@pytest.mark.parametrize("factor", ["0", "-2", "nan", "inf"])
def test_a_rope_factor_that_scales_nothing_is_refused_naming_the_flag(factor):
    with pytest.raises(ArgumentValidationError, match=rf"`--rope-factor` must be > 0\. Given: {factor}"):
        check(["--rope-factor", factor])


def test_an_unknown_rope_scaling_is_refused():
    with pytest.raises(SystemExit):
        parse_args(["--rope-scaling", "yarn"], {})
    with pytest.raises(ArgumentValidationError, match="ROPE_SCALING must be one of linear, dynamic. Given: ntk"):
        parse_args([], {"ROPE_SCALING": "ntk"})


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--max-input-tokens", "2048", "--max-total-tokens", "1024"],
         "`max_input_tokens`(2048) must be < `max_total_tokens`(1024)"),
        (["--max-input-tokens", "1000", "--max-total-tokens", "2000", "--max-batch-prefill-tokens", "500",
          "--no-prefill-chunking"],
         "`max_batch_prefill_tokens` must be >= `max_input_tokens`. Given: 500 and 1000"),
        (["--max-total-tokens", "4096", "--max-batch-total-tokens", "2048", "--max-batch-prefill-tokens", "1000"],
         "`max_total_tokens` must be <= `max_batch_total_tokens`. Given: 4096 and 2048"),
        (["--max-input-tokens", "10", "--max-input-length", "10"], "Both `max_input_tokens` (10) and"),
        (["--sharded", "false", "--num-shard", "2"], "`sharded` is false but `num_shard` > 1"),
        (["--sharded", "true", "--num-shard", "1"], "`sharded` is true but `num_shard` <= 1"),
        (["--num-shard", "0"], "`num_shard` cannot be < 1"),
        (["--validation-workers", "0"], "`validation_workers` must be > 0"),
        (["--quantize", "awq"], "`--quantize awq` is not supported"),
        (["--quantize", "int3"], "`--quantize` must be one of gguf, float, int8, int4, eetq, bitsandbytes"),
        (["--quantize", "int4", "--quantize-group-size", "20"], "must be a positive multiple of 32"),
        (["--grpc-port", "9000", "--metrics-port", "9000"], "`grpc_port` and `metrics_port` are both 9000"),
        (["--port", "8000"], "`http_port` and `port` are both 8000"),
        (["--metrics-port", "70000"], "`metrics_port` must be in 1..65535. Given: 70000"),
    ],
)
def test_tgi_start_up_checks(argv, message):
    with pytest.raises(ArgumentValidationError) as info:
        check(argv)
    assert message in str(info.value)


def test_bad_environment_value_is_reported_by_name():
    with pytest.raises(ArgumentValidationError, match="MAX_TOTAL_TOKENS"):
        parse_args([], {"MAX_TOTAL_TOKENS": "lots"})


def test_deprecated_max_input_length_fills_max_input_tokens():
    assert check(["--max-input-length", "100", "--max-total-tokens", "200"]).max_input_tokens == 100


def test_model_parameters_leave_unset_limits_empty():
    args = check(["--max-total-tokens", "512", "--dtype", "float32"])
    params = model_parameters(args, "/models/x")
    assert params["model_id"] == "/models/x"
    assert params["max_total_tokens"] == "512" and params["max_input_tokens"] == ""
    assert params["dtype"] == "float32" and params["json_output"] == "false"


def test_sharded_without_num_shard_uses_every_gpu():
    from tgi_llm.launcher.args import count_cuda_devices, find_num_shards

    assert find_num_shards(True, None, cuda_devices=lambda: 4) == 4
    with pytest.raises(ArgumentValidationError, match="`sharded` is true but only found 1 CUDA devices"):
        find_num_shards(True, None, cuda_devices=lambda: 1)
    assert find_num_shards(None, None, cuda_devices=lambda: 4) == 1
    assert count_cuda_devices({"CUDA_VISIBLE_DEVICES": "0,2"}) == 2


def test_shard_hosts_reach_the_model_with_a_hostfile_made_absolute(tmp_path, monkeypatch):
    (tmp_path / "hosts").write_text("node1:2\nnode2\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)  # tritonserver's model runs in another directory
    params = model_parameters(check(["--num-shard", "4", "--shard-hosts", "hosts"]), "/m")
    assert (params["shard_hosts"], params["shard_master_addr"]) == (str(tmp_path / "hosts"), "")
    env = {"NUM_SHARD": "3", "SHARD_HOSTS": "node1,node2", "SHARD_MASTER_ADDR": "10.0.0.5"}
    opts = EngineOptions.from_parameters(model_parameters(check([], env), "/m"))
    assert (opts.num_shard, opts.shard_hosts, opts.shard_master_addr) == (3, "node1,node2", "10.0.0.5")
    assert model_parameters(check([]), "/m")["shard_hosts"] == ""  # one host: nothing passed on


@pytest.mark.parametrize(("argv", "message"), [
    (["--shard-hosts", "node1"], "`shard_hosts` places shard ranks 1..N-1 and needs `num_shard` > 1. Given: 1"),
    (["--num-shard", "4", "--shard-hosts", "node1:2"], "`shard_hosts` has 2 slot(s) for the 3 shard ranks"),
    (["--num-shard", "2", "--shard-hosts", "./missing-hosts"], "`shard_hosts`: no MPI hostfile at ./missing-hosts"),
    (["--num-shard", "2", "--shard-hosts", "node1:x"], "`shard_hosts` entry 'node1:x': slots must be a whole"),
    (["--num-shard", "2", "--shard-master-addr", "10.0.0.5"], "`shard_master_addr` is where shards on other hosts"),
])
def test_bad_shard_host_flags_are_refused_naming_the_flag(argv, message):
    with pytest.raises(ArgumentValidationError) as info:
        check(argv)
    assert message in str(info.value)


def test_quantize_reaches_the_model_parameters_from_flag_or_environment():
    params = model_parameters(check(["--quantize", "int4", "--quantize-group-size", "64"]), "/m")
    assert params["quantize"] == "int4" and params["quantize_group_size"] == "64"
    args = validate(parse_args([], {"QUANTIZE": "eetq"}))
    assert model_parameters(args, "/m")["quantize"] == "eetq"
    assert model_parameters(check([]), "/m")["quantize"] == ""
    with pytest.raises(ArgumentValidationError, match="--quantize gptq"):
        validate(parse_args([], {"QUANTIZE": "gptq"}))


def test_kv_event_flags_reach_the_engine_options_from_flag_or_environment():
    args = check(["--kv-events-endpoint", "tcp://epp:5557", "--kv-events-topic", "kv@10.0.0.1@m"],
                 {"KV_EVENTS_REPLAY_ENDPOINT": "tcp://*:5558"})
    opts = EngineOptions.from_parameters(model_parameters(args, "/m"))
    assert (opts.kv_events_endpoint, opts.kv_events_replay_endpoint, opts.kv_events_topic) == \
        ("tcp://epp:5557", "tcp://*:5558", "kv@10.0.0.1@m")
    assert EngineOptions.from_parameters(model_parameters(check([]), "/m")).kv_events_endpoint is None


@pytest.mark.parametrize(("argv", "message"), [
    (["--kv-events-endpoint", "localhost:5557"], "`kv_events_endpoint` must be a ZMQ endpoint"),
    (["--kv-events-endpoint", "tcp://*:5557", "--kv-events-replay-endpoint", "tcp://*"],
     "`kv_events_replay_endpoint` must be a ZMQ endpoint"),
    (["--kv-events-replay-endpoint", "tcp://*:5558"], "`kv_events_replay_endpoint` needs `kv_events_endpoint`"),
])
def test_bad_kv_event_flags_are_refused_naming_the_flag(argv, message):
    with pytest.raises(ArgumentValidationError, match=message):
        check(argv)
