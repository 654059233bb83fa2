"""TGI's launcher flags (with their environment variables) plus Triton's ports, and TGI's start-up checks.

A flag's environment variable is its name in upper snake case (`--max-input-tokens` ->
MAX_INPUT_TOKENS), as clap's `env` gives TGI; the command line wins over the environment.
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tgi_llm.engine.kv_events import check_kv_event_endpoints
from tgi_llm.engine.limits import SCHEDULING_POLICIES, SHORTEST_PROMPT
from tgi_llm.engine.options import KV_CACHE_DTYPES
from tgi_llm.errors import ArgumentValidationError
from tgi_llm.models.rope_override import ROPE_SCALINGS, RopeOverride
from tgi_llm.speculation.policy import SERVED_SPECULATE

logger = logging.getLogger("tgi_llm.launcher")

DTYPES = ("float32", "float16", "bfloat16")
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _bool(text: str) -> bool:
    value = text.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


@dataclass(frozen=True)
class Flag:
    name: str  # the long flag without dashes, snake case
    type: Any = str
    default: Any = None
    help: str = ""
    env: str | None = ""  # "" = NAME in upper case; None = no environment variable
    choices: Sequence[str] | None = None
    switch: bool = False  # a bare `--flag` means true (TGI's boolean flags)
    negatable: bool = False  # `--no-flag` means false

    @property
    def env_name(self) -> str | None:
        return self.name.upper() if self.env == "" else self.env


FLAGS: list[Flag] = [
    Flag("model_id", help="Hub id, local HF directory or .gguf file (default: SmolLM2-135M-Instruct)"),
    Flag("revision", help="Hub revision (branch, tag or commit)"),
    Flag("validation_workers", int, 2, "Threads that tokenize and validate requests in the model (off Triton's "
                                       "execute thread)"),
    Flag("sharded", _bool, None, "Shard the model across GPUs"),
    Flag("num_shard", int, None, "Number of shards (GPUs)"),
    Flag("shard_hosts", help="Run shard ranks 1..N-1 on these hosts: an MPI hostfile (MPICH's: host[:slots] per line) "
                             "or host[:slots],host[:slots]; each host takes its slots of ranks in order (slots "
                             "default 1). Rank 0 is the server's model process on this host and takes no slot: "
                             "name this host too to put shards beside it. Needs ssh without a password to every "
                             "host, the same Python, install and model paths there; see docs/SHARDING.md"),
    Flag("shard_master_addr", help="The address shards on other hosts reach this host at (rank 0's TCP store; "
                                   "default with --shard-hosts: this host's name)"),
    Flag("quantize", help="Weight format: gguf (a GGUF's own blocks; the default for .gguf models), float, "
         "int8 (also TGI's eetq, bitsandbytes) or int4 weight-only; see the README"),
    Flag("quantize_group_size", int, None, "Group size of --quantize int8 / int4 along the input dim (default 32)"),
    Flag("dtype", choices=DTYPES, help="float32 on CPU, bfloat16 on CUDA by default"),
    Flag("trust_remote_code", switch=True, default=False),
    Flag("max_concurrent_requests", int, 128),
    Flag("max_best_of", int, 2),
    Flag("max_stop_sequences", int, 4),
    Flag("max_top_n_tokens", int, 5),
    Flag("max_input_tokens", int, None, "Longest prompt, in tokens"),
    Flag("max_input_length", int, None, "Deprecated alias of --max-input-tokens"),
    Flag("max_total_tokens", int, None, "Longest prompt + generation, in tokens"),
    Flag("waiting_served_ratio", float, 0.3),
    Flag("max_batch_prefill_tokens", int, None),
    Flag("max_batch_total_tokens", int, None, "KV-cache size in tokens (default: from --kv-cache-memory-gb)"),
    Flag("max_waiting_tokens", int, 20),
    Flag("max_batch_size", int, None),
    Flag("prefix_caching", switch=True, default=True, negatable=True,
         help="Reuse the KV cache of prompt prefixes seen before (TGI v3); --no-prefix-caching turns it off"),
    Flag("prefill_step_target_ms", int, None,
         help="With chunking, while streams decode, a step takes only the prompt tokens that fit this many ms "
              "(measured cost per token), so no stream waits longer for its next token (default: 300 on the "
              "CPU, off on GPUs; 0 turns it off)"),
    Flag("scheduling_policy", default=SHORTEST_PROMPT, choices=SCHEDULING_POLICIES,
         help="With chunking, which waiting request starts next: the shortest prompt first, a request that "
              "waited longer than its own prefill time never overtaken (default), or fcfs (arrival order)"),
    Flag("prefill_chunking", switch=True, default=True, negatable=True,
         help="Split long prompts across steps within --max-batch-prefill-tokens, so running streams never "
              "stall for a whole prompt (TGI v3); --no-prefill-chunking prefills each prompt in one step"),
    Flag("speculate", int, SERVED_SPECULATE,
         help="Speculative decoding: each stream guesses up to N next tokens by prompt lookup (where its last "
              "tokens occurred before) and one step verifies them; output is unchanged, and a stream guesses "
              "only while it pays (default 4; 0 turns it off)"),
    Flag("speculative_model",
         help="A smaller model with the same tokenizer (directory, hub id in the cache, or GGUF file) whose greedy "
              "guesses --speculate verifies, instead of prompt lookup (--speculate defaults to 4 with it)"),
    Flag("kv_cache_memory_gb", float, None, "KV-cache budget (default: on the CPU 16,384 tokens, or one request of "
                                            "--max-total-tokens where longer; on CUDA 80%% of free memory)"),
    Flag("kv_cache_dtype", default="auto", choices=KV_CACHE_DTYPES,
         help="Element type of the KV cache: auto (the --dtype: float32 on the CPU by default), float32, "
              "bfloat16, float16, or int8 (with a float16 scale per 16 values, as llama.cpp's q8_0 per 32); 16 "
              "bits hold twice float32's tokens in the same memory and decode long contexts faster, int8 3.56x"),
    Flag("rope_scaling", choices=ROPE_SCALINGS,
         help="Stretch the rotary embeddings past the model's max_position_embeddings, in place of its config's "
              "rope scaling: linear, or dynamic (NTK-aware: as trained up to max_position_embeddings; for models "
              "not fine-tuned on longer sequences). Alone: factor 1.0"),
    Flag("rope_factor", float, None,
         help="The rope scaling factor: the model's context becomes max_position_embeddings x factor. Alone: "
              "linear scaling"),
    Flag("lora_adapters",
         help="LoRA adapters in PEFT's format to serve beside the model: id=path,id2=path2 (a bare path is its own "
              "id); a request picks one by `adapter_id`, OpenAI's `model` or Triton's `lora_name`"),
    Flag("max_loras", int, None, "LoRA adapters resident at once; more may be registered, read from disk as "
                                 "requests need them (default: as many as --lora-adapters names, at least 1)"),
    Flag("max_lora_rank", int, None, "The largest LoRA rank served (default: the largest of --lora-adapters', "
                                     "else 16)"),
    Flag("lora_runtime_loading", switch=True, default=False,
         help="Serve POST /v1/load_lora_adapter and /v1/unload_lora_adapter (vLLM's), which add and remove LoRA "
              "adapters while the server runs"),
    Flag("kv_events_endpoint",
         help="Publish the prefix cache's stored and evicted blocks over ZMQ in vLLM's KV-event format, for "
              "prefix-aware routers (llm-d, Dynamo): tcp://*:PORT binds, tcp://HOST:PORT connects to a router's "
              "SUB socket (default: off)"),
    Flag("kv_events_replay_endpoint",
         help="A ZMQ ROUTER endpoint (tcp://*:PORT) that resends recent KV-event batches from a sequence number, "
              "for a subscriber that saw a gap"),
    Flag("kv_events_topic", default="", help="The topic frame of every KV-event message (llm-d: kv@POD_IP@MODEL)"),
    Flag("huggingface_hub_cache", help="Where hub downloads go"),
    Flag("json_output", switch=True, default=False, help="Log JSON lines"),
    Flag("log_level", default="info", env="LOG_LEVEL", help="TGI's LOG_LEVEL (info, debug, warn, error)"),
    Flag("graceful_termination_timeout", int, 90, "Seconds to finish in-flight requests on SIGTERM"),
    Flag("hostname", default="0.0.0.0", env=None,
         help="Address the public ports listen on (tritonserver itself listens on 127.0.0.1 only)"),
    Flag("http_port", int, 8000, "Triton HTTP port (generate, generate_stream, health)"),
    Flag("grpc_port", int, 8001, "Triton gRPC port (streaming inference)"),
    Flag("metrics_port", int, 8002, "Triton metrics port (tgi_* and nv_* metrics)"),
    Flag("port", int, 3000, "TGI- and OpenAI-compatible HTTP API (TGI's port); 0 disables it"),
    Flag("reasoning_format", default="auto", choices=("auto", "none"),
         help="auto: a thinking model's <think>...</think> part is returned as OpenAI's `reasoning_content` "
              "(where the tokenizer has those tokens); none: left in the content"),
    Flag("api_key", help="Require `Authorization: Bearer <key>` for generation on every port (health and "
                         "metrics stay open)"),
    Flag("payload_limit", int, 2_000_000, "Largest request body (HTTP) or message (gRPC) in bytes, on every port"),
    Flag("request_read_timeout", float, 30.0,
         "Seconds a client has to send a whole request (headers and body) before its connection is closed"),
    Flag("on_model_failure", default="restart", choices=("restart", "exit"),
         help="When the model's process dies or its engine fails: restart tritonserver (the public ports stay "
              "up and answer 503 meanwhile) or exit 1 so an orchestrator restarts the launcher"),
    Flag("max_model_restarts", int, 3, "Restarts allowed in 10 minutes before the launcher gives up and exits 1"),
    Flag("model_repository", env="TGI_LLM_MODEL_REPOSITORY",
         help="Directory to write the model repository into (default: a temporary directory)"),
    Flag("tritonserver", env="TRITONSERVER", help="tritonserver binary (default: system, else nvidia-pytriton's)"),
]


def build_parser(env: Mapping[str, str] | None = None) -> argparse.ArgumentParser:
    env = os.environ if env is None else env
    parser = argparse.ArgumentParser(
        prog="tgi-llm-launcher",
        description="Serve a model with TGI's engine inside NVIDIA Triton (tritonserver + Python backend).",
    )
    for flag in FLAGS:
        option = "--" + flag.name.replace("_", "-")
        default = flag.default
        raw = env.get(flag.env_name) if flag.env_name else None
        if raw not in (None, ""):
            default = _from_env(flag, raw)
        help_text = flag.help + (f" [env: {flag.env_name}]" if flag.env_name else "")
        if flag.switch:
            # `--json-output` alone means true; `--json-output false` is accepted too.
            parser.add_argument(option, nargs="?", const=True, type=_bool, default=default, help=help_text)
            if flag.negatable:
                parser.add_argument("--no-" + option[2:], dest=flag.name, action="store_const", const=False,
                                    help=argparse.SUPPRESS)
        else:
            parser.add_argument(option, type=flag.type, default=default, choices=flag.choices, help=help_text)
    return parser


def _from_env(flag: Flag, raw: str) -> Any:
    kind = _bool if flag.switch else flag.type
    try:
        value = kind(raw)
    except (ValueError, argparse.ArgumentTypeError):
        raise ArgumentValidationError(f"environment variable {flag.env_name}={raw!r} is not a valid value") from None
    if flag.choices and value not in flag.choices:
        raise ArgumentValidationError(f"{flag.env_name} must be one of {', '.join(flag.choices)}. Given: {raw}")
    return value


def parse_args(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> argparse.Namespace:
    return build_parser(env).parse_args(argv)


def count_cuda_devices(env: Mapping[str, str] | None = None) -> int:
    """CUDA_VISIBLE_DEVICES when set, else `nvidia-smi -L` (no torch import in the launcher)."""
    env = os.environ if env is None else env
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    try:
        listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, encoding="utf-8",
                                 errors="replace", timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in listing.splitlines() if line.startswith("GPU "))


def find_num_shards(sharded: bool | None, num_shard: int | None,
                    cuda_devices: Callable[[], int] = count_cuda_devices) -> int:
    """TGI's rules and messages. One difference: with neither flag set TGI shards over every GPU; we
    run one shard, because not every model splits evenly (the default model's 3 KV heads do not)."""
    if sharded is True and num_shard is None:
        n = cuda_devices()
        if n <= 1:
            raise ArgumentValidationError(f"`sharded` is true but only found {n} CUDA devices")
        return n
    if sharded is True and num_shard == 1:
        raise ArgumentValidationError("`sharded` is true but `num_shard` <= 1")
    if sharded is False and num_shard is not None and num_shard > 1:
        raise ArgumentValidationError("`sharded` is false but `num_shard` > 1")
    n = num_shard if num_shard is not None else 1
    if n < 1:
        raise ArgumentValidationError("`num_shard` cannot be < 1")
    return n


def validate(args: argparse.Namespace) -> argparse.Namespace:
    """TGI's launcher checks, with its messages; fills max_input_tokens from the deprecated alias."""
    if args.max_input_tokens is not None and args.max_input_length is not None:
        raise ArgumentValidationError(
            f"Both `max_input_tokens` ({args.max_input_tokens}) and `max_input_length` ({args.max_input_length}) "
            "are set. Please define only `max_input_tokens` as `max_input_length is deprecated for naming "
            "consistency."
        )
    if args.max_input_tokens is None:
        args.max_input_tokens = args.max_input_length
    if args.validation_workers == 0:
        raise ArgumentValidationError("`validation_workers` must be > 0")
    if args.payload_limit <= 0:
        raise ArgumentValidationError(f"`payload_limit` must be > 0. Given: {args.payload_limit}")
    if args.request_read_timeout <= 0:
        raise ArgumentValidationError(f"`request_read_timeout` must be > 0. Given: {args.request_read_timeout}")
    _check_ports(args)
    if args.max_model_restarts < 0:
        raise ArgumentValidationError(f"`max_model_restarts` must be >= 0. Given: {args.max_model_restarts}")
    from tgi_llm.quant.modes import parse_quantize

    try:
        parse_quantize(args.quantize, args.quantize_group_size)
        RopeOverride.from_flags(args.rope_scaling, args.rope_factor)
        check_lora_flags(args)
        check_kv_event_endpoints(args.kv_events_endpoint, args.kv_events_replay_endpoint)
    except ValueError as exc:
        raise ArgumentValidationError(str(exc)) from None
    if args.trust_remote_code:
        logger.warning("`trust_remote_code` is set. Trusting that model `%s` do not contain malicious code.",
                       args.model_id)
    args.num_shard = find_num_shards(args.sharded, args.num_shard)
    from tgi_llm.parallel.hosts import check_shard_hosts

    try:
        check_shard_hosts(args.shard_hosts, args.shard_master_addr, args.num_shard)
    except ValueError as exc:
        raise ArgumentValidationError(str(exc)) from None
    # The limit combinations: the engine's own check, so launcher and model agree on every message.
    from tgi_llm.engine.limits import check_static_limits

    check_static_limits(limit_options(args))
    return args


def check_lora_flags(args: argparse.Namespace) -> None:
    """--lora-adapters parses and names directories; --max-loras and --max-lora-rank are in range (ValueError)."""
    from pathlib import Path

    from tgi_llm.engine.options import MAX_LORA_LIMITS
    from tgi_llm.lora.spec import parse_lora_adapters

    for name, path in parse_lora_adapters(args.lora_adapters).items():
        if not Path(path).is_dir():
            raise ValueError(f"`lora_adapters` {name}: {path} is not a directory (a PEFT adapter: "
                             "adapter_config.json and adapter_model.safetensors)")
    for name, limit in MAX_LORA_LIMITS.items():
        value = getattr(args, name)
        if value is not None and not 1 <= value <= limit:
            raise ValueError(f"`{name}` must be in 1..{limit}. Given: {value}")


def lora_mode(args: argparse.Namespace) -> str:
    """What the front serves for LoRA: off, startup (adapters by `model`), runtime (and the load routes)."""
    if args.lora_runtime_loading:
        return "runtime"
    return "startup" if args.lora_adapters else "off"


def _check_ports(args: argparse.Namespace) -> None:
    """Each public port once: two listeners on one port fail only later, as a gateway that never starts."""
    named = {"http_port": args.http_port, "grpc_port": args.grpc_port, "metrics_port": args.metrics_port}
    if args.port:
        named["port"] = args.port
    for name, value in named.items():
        if not 0 < value < 65536:
            raise ArgumentValidationError(f"`{name}` must be in 1..65535. Given: {value}")
    seen: dict[int, str] = {}
    for name, value in named.items():
        if value in seen:
            raise ArgumentValidationError(f"`{seen[value]}` and `{name}` are both {value}: each port must differ")
        seen[value] = name


def limit_options(args: argparse.Namespace) -> Any:
    from dataclasses import fields

    from tgi_llm.engine.limits import LimitOptions

    return LimitOptions(**{f.name: getattr(args, f.name) for f in fields(LimitOptions) if hasattr(args, f.name)})


def model_parameters(args: argparse.Namespace, model_dir: str | None) -> dict[str, str]:
    """The config.pbtxt `parameters` for these flags (unset values left empty: the engine derives them)."""
    from dataclasses import fields

    from tgi_llm.engine.limits import LimitOptions

    values: dict[str, Any] = {f.name: getattr(args, f.name, None) for f in fields(LimitOptions)}
    values |= {
        "model_id": model_dir if model_dir is not None else args.model_id,
        "dtype": args.dtype,
        "num_shard": args.num_shard,
        "shard_hosts": _absolute_if_local(args.shard_hosts),  # a hostfile, as the model process will see it
        "shard_master_addr": args.shard_master_addr,
        "quantize": args.quantize,
        "quantize_group_size": args.quantize_group_size,
        "speculative_model": _absolute_if_local(args.speculative_model),
        "kv_cache_memory_gb": args.kv_cache_memory_gb,
        "kv_cache_dtype": args.kv_cache_dtype,
        "rope_scaling": args.rope_scaling,
        "rope_factor": args.rope_factor,
        "lora_adapters": _absolute_adapters(args.lora_adapters),
        "max_loras": args.max_loras,
        "max_lora_rank": args.max_lora_rank,
        "lora_runtime_loading": "true" if args.lora_runtime_loading else "false",
        "kv_events_endpoint": args.kv_events_endpoint,
        "kv_events_replay_endpoint": args.kv_events_replay_endpoint,
        "kv_events_topic": args.kv_events_topic,
        "json_output": "true" if args.json_output else "false",
        "validation_workers": args.validation_workers,
    }
    return {k: "" if v is None else str(v) for k, v in values.items()}


def _absolute_adapters(text: str | None) -> str | None:
    """--lora-adapters with each path as the model process will see it."""
    from tgi_llm.lora.spec import parse_lora_adapters

    adapters = parse_lora_adapters(text)
    return ",".join(f"{name}={_absolute_if_local(path)}" for name, path in adapters.items()) or None


def _absolute_if_local(path: str | None) -> str | None:
    """A local path as the model process will see it (tritonserver runs in another directory)."""
    from pathlib import Path

    return str(Path(path).resolve()) if path and Path(path).exists() else path

