"""Tensor parallelism over MPI-spawned shard processes (gloo on the CPU): same logits and tokens as one
shard, a clear error for splits that do not divide, shard failure ends every request, no orphans."""

from __future__ import annotations

import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from tgi_llm import LLM
from tgi_llm.errors import ArgumentValidationError
from tgi_llm.events import ErrorEvent, FinalEvent, TokenEvent
from tgi_llm.kv_cache import KV_CACHE_TYPES, allocate_kv_cache
from tgi_llm.models.loader import load_model
from tgi_llm.models.registry import read_config_dir
from tgi_llm.parallel import ShardedModelRunner, ShardGroup, launch
from tgi_llm.procfs import pid_alive
from tgi_llm.runner.model_runner import ModelRunner

from ..conftest import PlanPlayer
from ..speculation.always_pays import AlwaysPays
from .conftest import shard_pids

CPU = torch.device("cpu")


def mpich_segments() -> set[str]:
    return {n for n in os.listdir("/dev/shm") if n.startswith("mpich_shm_")} if os.path.isdir("/dev/shm") else set()
BLOCK, NUM_BLOCKS = 16, 64
HANG_GUARD_S = 60.0  # "within seconds" as a generous bound, never a timing assertion


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


def wait_for(condition, timeout_s: float = HANG_GUARD_S) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def prefill_then_decode(forward, prompts: list[list[int]]) -> list[torch.Tensor]:
    """Logits of the scheduler's plans for `prompts` (every prompt row: decoder_input_details): the prefill
    step, in chunks of 16 tokens, then a decode step."""
    player = PlanPlayer(block_size=BLOCK, num_blocks=NUM_BLOCKS, step_tokens=16 * len(prompts),
                        next_token=lambda r: prompts[r - 1][0])
    for p in prompts:
        player.add(p, decoder_input_details=True)
    out = []
    while True:
        plan = player.plan()
        out.append(forward(plan))
        player.advance(plan)
        if all(e.is_decode for e in plan.seqs):
            return out


def unsharded_logits(model_dir, prompts):
    model, config = load_model(model_dir)
    runner = ModelRunner(model, allocate_kv_cache(config, NUM_BLOCKS, BLOCK), BLOCK, config.vocab_size, CPU)
    return prefill_then_decode(lambda plan: runner.forward_plan(plan)[1], prompts)


def sharded_logits(model_dir, prompts, num_shard: int):
    group = ShardGroup.launch(num_shard, model_dir, torch.float32, CPU)
    try:
        model, config = load_model(model_dir, shard=group.shard)
        caches = allocate_kv_cache(group.cache_config(config), NUM_BLOCKS, BLOCK)
        runner = ShardedModelRunner(group, model, caches, BLOCK, config.vocab_size, CPU)
        return prefill_then_decode(lambda plan: runner.forward_plan(plan)[1], prompts)
    finally:
        group.stop()


def random_prompts(lengths: list[int], vocab: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(0)
    return [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in lengths]


@pytest.mark.parametrize("model_type,overrides", [
    ("llama", {"attention_bias": True, "mlp_bias": True}),  # row-parallel biases live on rank 0 only
    ("qwen2", {"tie_word_embeddings": True}),  # q/k/v biases split; LM head = the vocab-split embedding
    ("phi3", {"pad_token_id": 0}),  # fused qkv and gate/up weights: each part split on its own
    ("qwen3", {"head_dim": 16}),  # per-head q/k norms
    ("gemma2", {"head_dim": 16, "sliding_window": 6, "num_hidden_layers": 4}),  # norms after the reduce, soft-caps
    ("mixtral", {"num_local_experts": 4, "sliding_window": None}),  # each expert split; the router on every rank
])
def test_two_shard_prefill_and_decode_logits_match_one_shard(tiny_model_factory, model_type, overrides):
    model_dir = tiny_model_factory(model_type, **overrides)  # 4 heads, 2 KV heads: divisible by 2
    prompts = random_prompts([17, 5, 33], vocab=256)
    want = unsharded_logits(model_dir, prompts)
    got = sharded_logits(model_dir, prompts, num_shard=2)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape
        assert rel_err(g, w) < 1e-4
    assert shard_pids() == []


def run_requests(llm: LLM, prompts, params) -> list[FinalEvent]:
    done: queue.SimpleQueue = queue.SimpleQueue()
    for i, p in enumerate(prompts):
        llm.submit(p, params, lambda e, i=i: done.put((i, e)) if not isinstance(e, TokenEvent) else None)
    finals = {}
    while len(finals) < len(prompts):
        i, event = done.get(timeout=HANG_GUARD_S)
        assert isinstance(event, FinalEvent), event
        finals[i] = event
    return [finals[i] for i in range(len(prompts))]


def test_two_shards_give_the_greedy_tokens_of_one(tiny_llama_dir):
    prompts = ["Hello, my name is", "The capital of France is", list(range(20, 60))]
    params = {"max_new_tokens": 12, "decoder_input_details": True, "top_n_tokens": 3, "details": True}
    kwargs = {"kv_cache_memory_gb": 0.05, "max_total_tokens": 256}
    with LLM(str(tiny_llama_dir), **kwargs) as one:
        want = run_requests(one, prompts, params)
    shm_before = mpich_segments()
    with LLM(str(tiny_llama_dir), num_shard=2, **kwargs) as two:
        got = run_requests(two, prompts, params)
        stats = two.engine.stats()
        assert stats.kv_blocks_free == stats.kv_blocks_total
        assert mpich_segments() - shm_before == set()  # unlinked once the hand-shake is over (mpi_shm.py)
    assert [g.token_ids for g in got] == [w.token_ids for w in want]
    for g, w in zip(got, want, strict=True):  # prompt logprobs come from the gathered full-vocab logits
        assert [t.logprob for t in g.prefill[1:]] == pytest.approx([t.logprob for t in w.prefill[1:]], abs=1e-4)
    assert shard_pids() == []


@pytest.mark.parametrize("kv_dtype", ["bfloat16", "int8"])
def test_two_shards_with_a_16_or_8_bit_kv_cache_give_the_tokens_of_one(tiny_llama_dir, kv_dtype):
    """Every rank allocates the cache type rank 0 resolved (ShardSetup.kv_cache_dtype); a rank caches half
    the KV heads, so the same memory holds twice the blocks; the same tokens."""
    prompts = ["Hello, my name is", list(range(20, 60))]
    kwargs = {"kv_cache_memory_gb": 0.05, "max_total_tokens": 256, "kv_cache_dtype": kv_dtype}
    with LLM(str(tiny_llama_dir), **kwargs) as one:
        want = run_requests(one, prompts, {"max_new_tokens": 12})
        blocks = one.engine.stats().kv_blocks_total
    with LLM(str(tiny_llama_dir), num_shard=2, **kwargs) as two:
        assert two.engine.stats().kv_blocks_total in (2 * blocks, 2 * blocks + 1)  # whole blocks of the budget
        assert all(k.dtype == KV_CACHE_TYPES[kv_dtype] for pair in two.engine.runner.kv_caches for k in pair)
        got = run_requests(two, prompts, {"max_new_tokens": 12})
    assert [g.token_ids for g in got] == [w.token_ids for w in want]
    assert shard_pids() == []


def test_two_shards_rotate_with_the_rope_flags_of_rank_0(tiny_llama_dir):
    """Every rank applies the override rank 0 was given (ShardSetup.rope_scaling / rope_factor): a prompt past
    the 512 positions of the model's config, in the context --rope-factor 2 allows, gives the tokens of one."""
    prompts = [list(range(100, 700))]
    kwargs = {"kv_cache_memory_gb": 0.05, "rope_scaling": "dynamic", "rope_factor": 2.0,
              "max_batch_prefill_tokens": 1024}
    with LLM(str(tiny_llama_dir), **kwargs) as one:
        want = run_requests(one, prompts, {"max_new_tokens": 12, "ignore_eos": True})
    with LLM(str(tiny_llama_dir), num_shard=2, **kwargs) as two:
        assert two.engine.limits.max_total_tokens == 1024
        got = run_requests(two, prompts, {"max_new_tokens": 12, "ignore_eos": True})
    assert [g.token_ids for g in got] == [w.token_ids for w in want]
    assert shard_pids() == []


def test_two_shards_verify_draft_tokens_and_give_the_tokens_of_one(tiny_llama_dir):
    """The plan codec carries each decode's draft tokens and moved starts: both ranks run the same rows."""
    prompts = [list(range(20, 40)) * 3, "Hello, my name is"]
    params = {"max_new_tokens": 40, "ignore_eos": True}
    kwargs = {"kv_cache_memory_gb": 0.05, "max_total_tokens": 256}
    with LLM(str(tiny_llama_dir), **kwargs) as one:
        want = run_requests(one, prompts, params)
    with LLM(str(tiny_llama_dir), num_shard=2, speculate=4, **kwargs) as two:
        two.engine.scheduler.speculation = AlwaysPays(4)
        got = run_requests(two, prompts, params)
        assert two.engine.scheduler.num_draft_tokens > 0  # rejected ones too move starts back
        assert two.engine.stats().kv_blocks_free == two.engine.stats().kv_blocks_total
    assert [g.token_ids for g in got] == [w.token_ids for w in want]
    assert shard_pids() == []


def test_killing_a_shard_mid_generation_fails_every_request_and_leaves_no_process(tiny_llama_dir):
    llm = LLM(str(tiny_llama_dir), num_shard=2, kv_cache_memory_gb=0.05, max_total_tokens=512)
    try:
        events: dict[int, queue.SimpleQueue] = {i: queue.SimpleQueue() for i in range(4)}
        params = {"max_new_tokens": 400, "ignore_eos": True}  # still generating when the shard dies
        for i in events:
            llm.submit([5 + i] * (3 + i), params, events[i].put)
        first = [events[i].get(timeout=HANG_GUARD_S) for i in events]  # every request is generating
        assert all(isinstance(e, TokenEvent) for e in first), first
        (shard,) = llm.engine.runner.group.pids
        os.kill(shard, signal.SIGKILL)
        finals = {}
        for i, q in events.items():
            event = q.get(timeout=HANG_GUARD_S)
            while isinstance(event, TokenEvent):
                event = q.get(timeout=HANG_GUARD_S)
            finals[i] = event
        assert all(isinstance(e, ErrorEvent) for e in finals.values()), finals
        assert any("shard 1" in str(e.error) for e in finals.values()), finals
        assert llm.engine.healthy is False
    finally:
        llm.close()
    assert not pid_alive(shard)
    assert shard_pids() == []


def test_a_hung_shard_fails_the_step_after_the_collective_timeout(tiny_llama_dir, monkeypatch):
    monkeypatch.setattr(launch, "COLLECTIVE_TIMEOUT_S", 2.0)
    llm = LLM(str(tiny_llama_dir), num_shard=2, kv_cache_memory_gb=0.05, max_total_tokens=512)
    try:
        events: queue.SimpleQueue = queue.SimpleQueue()
        llm.submit("Count to ten", {"max_new_tokens": 400, "ignore_eos": True}, events.put)
        assert isinstance(events.get(timeout=HANG_GUARD_S), TokenEvent)
        (shard,) = llm.engine.runner.group.pids
        os.kill(shard, signal.SIGSTOP)  # alive but silent: only the timeout can tell
        event = events.get(timeout=HANG_GUARD_S)
        while isinstance(event, TokenEvent):
            event = events.get(timeout=HANG_GUARD_S)
        assert isinstance(event, ErrorEvent), event
        assert llm.engine.healthy is False
    finally:
        llm.close()  # kills the stopped shard
    assert shard_pids() == []


def test_an_idle_shard_dying_marks_the_engine_unhealthy(tiny_llama_dir):
    llm = LLM(str(tiny_llama_dir), num_shard=2, kv_cache_memory_gb=0.05, max_total_tokens=256)
    try:
        assert llm.engine.healthy
        os.kill(llm.engine.runner.group.pids[0], signal.SIGKILL)
        assert wait_for(lambda: not llm.engine.healthy)
        with pytest.raises(Exception, match="shard 1"):
            llm.generate(["Hello"], {"max_new_tokens": 4})
    finally:
        llm.close()
    assert shard_pids() == []


RANK0 = textwrap.dedent("""
    import sys, time
    from tgi_llm import LLM
    llm = LLM(sys.argv[1], num_shard=2, shard_hosts=sys.argv[2] or None, kv_cache_memory_gb=0.02,
              max_total_tokens=128)
    print(*llm.engine.runner.group.pids, flush=True)
    time.sleep(600)
""")


@pytest.mark.parametrize("hosts", ["", "localhost"], ids=["one-host", "shard-hosts"])
def test_rank0_dying_ends_its_shards_and_spares_its_process_group(tiny_llama_dir, hosts):
    """MPICH's process manager SIGKILLs the process group of an MPI job whose process died; rank 0's
    group (tritonserver's, in Triton) must survive it, and the shards must not outlive rank 0 (with
    --shard-hosts they cannot watch its pid: rank 0's store going away ends them)."""
    group = subprocess.Popen(["sh", "-c", f'"{sys.executable}" -c "$0" "$1" "$2" & sleep 600', RANK0,
                              str(tiny_llama_dir), hosts], stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        rank0 = None
        line = group.stdout.readline()  # the shard pids, once the model is up
        shards = [int(p) for p in line.split()]
        assert shards, "rank 0 did not come up"
        rank0 = next(p for p in _group_members(group.pid) if p != group.pid and _is_python(p))
        os.kill(rank0, signal.SIGKILL)
        assert wait_for(lambda: not any(pid_alive(p) for p in shards))
        time.sleep(1.0)  # give a process manager that would kill the group the chance to do it
        assert group.poll() is None and pid_alive(group.pid), "rank 0's process group was killed"
    finally:
        os.killpg(group.pid, signal.SIGKILL)
        group.wait()


def _group_members(pgid: int) -> list[int]:
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit() and pid_alive(int(name)):
            try:
                if os.getpgid(int(name)) == pgid:
                    out.append(int(name))
            except OSError:
                pass
    return out


def _is_python(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"tgi_llm import LLM" in f.read()
    except OSError:
        return False


def test_shards_that_cannot_start_fail_the_launch_instead_of_hanging_it(tiny_llama_dir, tmp_path):
    """MPI_Comm_spawn waits forever for children that never connect; in its own process, as it leaves
    MPI unusable there. Nothing is left in its temporary directory (the mpiexec shim's)."""
    code = f"""
from tgi_llm import LLM
try:
    LLM({str(tiny_llama_dir)!r}, num_shard=2, kv_cache_memory_gb=0.02)
except RuntimeError as exc:
    print("raised:", exc)
"""
    env = dict(os.environ, TGI_SHARD_PYTHON="/bin/false", TGI_SHARD_SPAWN_TIMEOUT_S="3", TMPDIR=str(tmp_path))
    before = set(Path("/dev/shm").glob("mpich_shm_*"))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=HANG_GUARD_S)
    assert "raised: shard processes did not start within 3s" in out.stdout, out.stdout + out.stderr
    assert out.returncode == 0
    assert set(Path("/dev/shm").glob("mpich_shm_*")) <= before  # MPI's segment is not left behind
    assert list(tmp_path.glob("tgi-llm-mpiexec-*")) == []


# ---- --shard-hosts: the multi-host path, on this host under two names ----

def test_three_ranks_placed_by_a_hostfile_match_one_and_a_dead_shard_is_noticed_without_its_pid(
        tiny_model_factory, tmp_path, monkeypatch):
    """A hostfile naming localhost twice puts ranks 1 and 2 through MPICH's `hostfile` spawn key. With it the
    ranks rendezvous at this host's name (not 127.0.0.1) and watch each other by heartbeat: an idle shard that
    dies is noticed by its silence, and stop() leaves no process."""
    model_dir = tiny_model_factory("llama", hidden_size=96, num_attention_heads=6, num_key_value_heads=3,
                                   intermediate_size=192, vocab_size=258)  # splits by 3
    (tmp_path / "hosts").write_text("localhost:1\n# the same host again, as a second node\nlocalhost\n")
    prompts = random_prompts([17, 5], vocab=258)
    want = unsharded_logits(model_dir, prompts)
    monkeypatch.setattr(launch, "HEARTBEAT_TIMEOUT_S", 3.0)
    group = ShardGroup.launch(3, model_dir, torch.float32, CPU, shard_hosts=str(tmp_path / "hosts"))
    try:
        assert group.heartbeats is not None and group.hosts == [socket.gethostname()] * 2
        assert group.local_pids == group.pids  # this host: they can still be killed if they hang
        model, config = load_model(model_dir, shard=group.shard)
        caches = allocate_kv_cache(group.cache_config(config), NUM_BLOCKS, BLOCK)
        runner = ShardedModelRunner(group, model, caches, BLOCK, config.vocab_size, CPU)
        got = prefill_then_decode(lambda plan: runner.forward_plan(plan)[1], prompts)
        for g, w in zip(got, want, strict=True):
            assert rel_err(g, w) < 1e-4
        assert group.failure is None
        os.kill(group.pids[1], signal.SIGKILL)
        assert wait_for(lambda: group.failure is not None)
        assert "shard 2" in group.failure and "silent for" in group.failure, group.failure
    finally:
        group.stop()
    assert shard_pids() == []


def test_a_host_that_cannot_be_reached_fails_the_launch_naming_the_hosts(tiny_llama_dir, tmp_path):
    """The `host` spawn key reaches MPICH: hydra tries to start a proxy on the named host (over ssh), which
    cannot resolve, and the spawn timeout turns the hang into an error that says what every host needs."""
    code = f"""
from tgi_llm import LLM
try:
    LLM({str(tiny_llama_dir)!r}, num_shard=2, shard_hosts="no-such-host.invalid", kv_cache_memory_gb=0.02)
except RuntimeError as exc:
    print("raised:", exc)
"""
    env = dict(os.environ, TGI_SHARD_SPAWN_TIMEOUT_S="5", TMPDIR=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=HANG_GUARD_S)
    assert "raised: shard processes did not start within 5s" in out.stdout, out.stdout + out.stderr
    assert "on every host of `shard_hosts` (no-such-host.invalid)" in out.stdout
    if shutil.which("ssh"):
        assert "no-such-host.invalid" in out.stderr  # ssh's own complaint, through hydra
    assert out.returncode == 0


# ---- the real default model: 9 attention heads, 3 KV heads ----

def test_a_family_that_cannot_be_split_is_refused_at_start_up(tiny_model_factory):
    config = read_config_dir(tiny_model_factory("olmo2"))
    launch.check_tp_split(config, 1)
    with pytest.raises(ArgumentValidationError, match="`num_shard` 2: OLMo 2 normalizes q and k over all heads"):
        launch.check_tp_split(config, 2)


def test_two_shards_on_the_default_model_is_a_clear_start_up_error(default_model_dir):
    with pytest.raises(ArgumentValidationError) as info:
        LLM(None, num_shard=2)
    message = str(info.value)
    assert "num_attention_heads (9)" in message and "num_key_value_heads (3)" in message
    assert "Given: 2" in message and "divide all of them: 3" in message
    assert shard_pids() == []


@pytest.mark.slow
def test_three_shards_match_one_on_the_default_model(default_model_dir):
    prompts = random_prompts([24, 7], vocab=49152)
    want = unsharded_logits(default_model_dir, prompts)
    got = sharded_logits(default_model_dir, prompts, num_shard=3)
    for g, w in zip(got, want, strict=True):
        assert rel_err(g, w) < 1e-4
    assert shard_pids() == []


@pytest.mark.slow
def test_three_shards_give_the_greedy_tokens_of_one_on_the_default_model(default_model_dir):
    """Prompts sharing a prefix, one after another: on three shards the second reads the first's cached
    blocks (the plan hands every rank the same block ids) and still gives one shard's tokens."""
    shared = "You are a poet who answers every question with a short rhyme about the weather and the sea. " * 3
    prompts = [shared + "What is the capital of France?", shared + "Write a haiku about the sea."]
    params = {"max_new_tokens": 16}
    with LLM(None, kv_cache_memory_gb=0.05, max_total_tokens=512, prefix_caching=False) as one:
        want = [r.token_ids for r in one.generate(prompts, params)]
    with LLM(None, num_shard=3, kv_cache_memory_gb=0.05, max_total_tokens=512) as three:
        got = [three.generate([p], params)[0] for p in prompts]
    assert [r.token_ids for r in got] == want
    assert got[1].final.cached_tokens >= 48
    assert shard_pids() == []
