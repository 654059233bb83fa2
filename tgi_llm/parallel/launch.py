"""Rank 0's side of the shard processes: spawn them as MPI ranks, rendezvous, watch, stop.

MPI (mpi4py over the `mpich` wheel) launches the shards and hands each its setup; from then on the
ranks talk through torch.distributed only. Three facts about MPICH's process manager (hydra), which a
singleton like the Triton model process starts on its first `Spawn`, shape this package:

* When an MPI process dies without finalizing, hydra SIGKILLs the *process group* of the process that
  started it. Inside Triton that group is tritonserver's own. So the `mpiexec` that hydra runs from is
  started in its own session (`_mpiexec_shim`), and each shard tells hydra it is finished with PMI right
  after the hand-shake (`shard_main._leave_pmi`): a shard that dies later is ours to notice, not hydra's.
* Once a spawned process has died by a signal, the next MPI_Comm_spawn in this process segfaults. So the
  spawned process is only a guard that forks the real shard and always exits plainly (`shard_main`).
* MPI_Finalize on rank 0 after a shard died segfaults too; mpi4py's exit-time finalize is turned off.
"""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from tgi_llm.errors import ArgumentValidationError
from tgi_llm.models.config import ModelConfig
from tgi_llm.models.registry import read_config_dir
from tgi_llm.models.rope_override import RopeOverride
from tgi_llm.parallel.comm import SETUP, STOP, PlanChannel, destroy_groups, init_groups
from tgi_llm.parallel.hosts import ShardHosts, check_shard_hosts
from tgi_llm.parallel.mpi_shm import unlink_mapped_segments
from tgi_llm.procfs import pid_alive
from tgi_llm.weights.safetensors_loader import Shard

logger = logging.getLogger(__name__)

PACKAGE_ROOT = Path(__file__).resolve().parents[2]
#: A collective waits this long for the other ranks before the step fails (a hung shard). A dead shard
#: fails it at once: its sockets close.
COLLECTIVE_TIMEOUT_S = float(os.environ.get("TGI_SHARD_TIMEOUT_S", "30"))
#: Spawning, loading every rank's weights and the rendezvous must finish within this.
START_TIMEOUT_S = float(os.environ.get("TGI_SHARD_START_TIMEOUT_S", "600"))
#: The spawned processes must check in (MPI hand-shake, no torch yet) within this.
SPAWN_TIMEOUT_S = float(os.environ.get("TGI_SHARD_SPAWN_TIMEOUT_S", "120"))
POLL_S = 0.2
#: Rank 0's TCP store listens on this port (0: one the kernel picks). Pin it where a firewall sits between hosts.
STORE_PORT = int(os.environ.get("TGI_SHARD_STORE_PORT", "0"))
#: With --shard-hosts no rank can watch another's pid: each shard bumps a counter on rank 0's store every
#: HEARTBEAT_S, and rank 0 takes one silent for HEARTBEAT_TIMEOUT_S (SPAWN_TIMEOUT_S before its first beat)
#: as gone. A shard that cannot reach the store takes rank 0 as gone.
HEARTBEAT_S = 1.0
HEARTBEAT_TIMEOUT_S = float(os.environ.get("TGI_SHARD_HEARTBEAT_TIMEOUT_S", "10"))
#: Why MPI can no longer spawn in this process, once it cannot: MPICH crashes in MPI_Comm_spawn after a
#: process it spawned died by a signal (our guards never do, unless killed).
_SPAWN_BROKEN: str | None = None


@dataclass(frozen=True)
class ShardSetup:
    """What rank 0 tells every shard in the MPI hand-shake (as a dict over MPI_Bcast)."""

    model_dir: str
    dtype: str
    device: str  # rank 0's device; shard r uses the same type, index + r on CUDA
    world_size: int
    store_port: int
    parent_pid: int
    threads: int
    collective_timeout_s: float
    start_timeout_s: float
    quantize: str = ""  # --quantize and its group size ("" / 0: unset), so every rank loads the same format
    quantize_group_size: int = 0
    kv_cache_dtype: str = ""  # the KV cache's type as rank 0 resolved it ("": auto), so every rank caches it
    rope_scaling: str = ""  # --rope-scaling / --rope-factor as rank 0 resolved them ("" / 0: the config's rope)
    rope_factor: float = 0.0
    lora_slots: int = 0  # --max-loras and --max-lora-rank as rank 0 resolved them (0: no LoRA)
    lora_rank: int = 0
    store_host: str = "127.0.0.1"  # where shards reach rank 0's TCP store (--shard-master-addr)
    multi_host: bool = False  # --shard-hosts: ranks may be on other hosts: heartbeats instead of pids, no loopback


def check_tp_split(config: ModelConfig, num_shard: int, model: str = "the model") -> None:
    """Megatron splits heads, KV heads, the MLP and the vocabulary evenly: fail at start-up, naming both
    numbers and what would divide, before any process is spawned."""
    if num_shard > 1 and config.tensor_parallel_refusal:
        raise ArgumentValidationError(f"`num_shard` {num_shard}: {config.tensor_parallel_refusal}; serve "
                                      f"{model} with one shard")
    sizes = {"num_attention_heads": config.num_attention_heads, "num_key_value_heads": config.num_key_value_heads,
             "intermediate_size": config.intermediate_size, "vocab_size": config.vocab_size}
    bad = [f"{name} ({size})" for name, size in sizes.items() if size % num_shard]
    if bad:
        ok = [n for n in range(2, config.num_key_value_heads + 1) if all(s % n == 0 for s in sizes.values())]
        hint = f"; num_shard values that divide all of them: {', '.join(map(str, ok))}" if ok else \
            "; only num_shard 1 works for this model"
        raise ArgumentValidationError(
            f"`num_shard` must divide {' and '.join(bad)} of {model} for tensor parallelism. "
            f"Given: {num_shard}{hint}")


def local_config(config: ModelConfig, world_size: int) -> ModelConfig:
    """The config as one rank's KV cache sees it: 1/world_size of the heads and KV heads."""
    return replace(config, num_attention_heads=config.num_attention_heads // world_size,
                   num_key_value_heads=config.num_key_value_heads // world_size)


def _wait_gone(pids: list[int], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while any(pid_alive(p) for p in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _kill_all(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


@dataclass
class Heartbeats:
    """Rank 0's view of the shards' heartbeat counters on its store (--shard-hosts, where pids say nothing).
    Its own store connection: the watch thread and the start-up poll share it under the lock."""

    client: dist.TCPStore
    world_size: int
    started: float = field(default_factory=time.monotonic)
    last: dict[int, tuple[int, float]] = field(default_factory=dict)  # rank -> (count, when it last changed)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def silent(self) -> list[tuple[int, float]]:
        """The shards silent past their limit, with the seconds since each was last heard from."""
        now, out = time.monotonic(), []
        with self.lock:
            for rank in range(1, self.world_size):
                count = self.client.add(f"tgi/beat/{rank}", 0)
                seen, since = self.last.get(rank, (0, self.started))
                if count != seen:
                    self.last[rank] = (count, now)
                elif now - since > (HEARTBEAT_TIMEOUT_S if count else SPAWN_TIMEOUT_S):
                    out.append((rank, now - since))
        return out


class ShardGroup:
    """Ranks 1..N-1 of one sharded model, seen from rank 0 (this process)."""

    def __init__(self, num_shard: int, pids: list[int], guards: list[int], store: dist.TCPStore,
                 device: torch.device, hosts: list[str] | None = None, heartbeats: Heartbeats | None = None) -> None:
        self.shard = Shard(0, num_shard)
        self.pids = pids  # the shard processes, rank order (a shard on another host: its pid there)
        self.guards = guards  # their MPI-facing parents, which exit right after them
        self.hosts = hosts or [socket.gethostname()] * len(pids)  # each shard's host name, rank order
        self.store = store
        self.device = device
        self.heartbeats = heartbeats  # None: every shard is on this host, watched by pid
        here = socket.gethostname()
        # The processes this one can see, wait for and kill: all of them unless --shard-hosts was given.
        local = [i for i, host in enumerate(self.hosts) if heartbeats is None or host == here]
        self.local_pids = [pids[i] for i in local]
        self.local_guards = [guards[i] for i in local]
        self.channel: PlanChannel | None = None
        self.failure: str | None = None
        self._callbacks: list[Callable[[str], None]] = []
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        # Should rank 0 fail between spawn and stop (a bad weight file), no shard outlives this object (one on
        # another host sees the store close with it, and exits).
        self._finalizer = weakref.finalize(self, _kill_all, list(self.local_pids))  # guards follow by themselves
        threading.Thread(target=self._watch, name="tgi-shard-watch", daemon=True).start()

    # ---- start-up ----
    @classmethod
    def launch(cls, num_shard: int, model_dir: str | Path, dtype: torch.dtype, device: torch.device,
               model_name: str | None = None, quantize: str | None = None,
               quantize_group_size: int | None = None, kv_cache_dtype: str | None = None,
               rope_override: RopeOverride | None = None, lora_slots: int = 0, lora_rank: int = 0,
               shard_hosts: str | None = None, master_addr: str | None = None) -> ShardGroup:
        """`shard_hosts` / `master_addr`: --shard-hosts and --shard-master-addr (hosts.py); without them every
        rank runs on this host and talks over loopback."""
        config = read_config_dir(model_dir)
        check_tp_split(config, num_shard, model_name or str(model_dir))
        try:
            hosts = check_shard_hosts(shard_hosts, master_addr, num_shard)
        except ValueError as exc:
            raise ArgumentValidationError(str(exc)) from None
        # With other hosts, only the shards placed here share this host's GPUs: each checks its own device.
        if device.type == "cuda" and hosts is None and torch.cuda.device_count() < (device.index or 0) + num_shard:
            raise ArgumentValidationError(
                f"`num_shard` {num_shard} needs one GPU per shard; {torch.cuda.device_count()} visible")
        if _SPAWN_BROKEN is not None:
            raise RuntimeError(f"cannot spawn shard processes again in this process ({_SPAWN_BROKEN}; MPICH "
                               "would crash): restart it")
        threads = max(1, (os.cpu_count() or 1) // num_shard)
        if device.type == "cpu" and os.environ.get("OMP_NUM_THREADS") is None:
            torch.set_num_threads(threads)  # the ranks share the cores
        # torch's store listens on every interface whatever the address: the address is what the shards dial.
        store_host = master_addr or (socket.gethostname() if hosts else "127.0.0.1")
        try:
            store = dist.TCPStore(store_host, STORE_PORT, num_shard, is_master=True, wait_for_workers=False,
                                  timeout=timedelta(seconds=START_TIMEOUT_S))
        except Exception as exc:
            raise RuntimeError(f"rank 0's TCP store on port {STORE_PORT} (TGI_SHARD_STORE_PORT): {exc}") from exc
        setup = ShardSetup(os.path.abspath(model_dir) if hosts else str(model_dir),  # a remote cwd differs
                           str(dtype).removeprefix("torch."), str(device), num_shard, store.port,
                           os.getpid(), threads, COLLECTIVE_TIMEOUT_S, START_TIMEOUT_S, quantize or "",
                           quantize_group_size or 0, kv_cache_dtype or "",
                           rope_scaling=rope_override.scaling if rope_override else "",
                           rope_factor=rope_override.factor if rope_override else 0.0, lora_slots=lora_slots,
                           lora_rank=lora_rank, store_host=store_host, multi_host=hosts is not None)
        heartbeats = None
        if hosts is not None:  # before the spawn: nothing may fail between it and the ShardGroup that stops them
            heartbeats = Heartbeats(dist.TCPStore(store_host, store.port, is_master=False, wait_for_workers=False,
                                                  timeout=timedelta(seconds=START_TIMEOUT_S)), num_shard)
        pids, guards, hostnames = _spawn(setup, hosts)
        if heartbeats is not None:
            heartbeats.started = time.monotonic()  # the first-beat grace counts from the hand-shake
        logger.info("spawned %d shard processes (pids %s on %s) for %s; rank 0's store at %s:%d", num_shard - 1,
                    pids, ", ".join(hostnames), model_dir, store_host, store.port)
        return cls(num_shard, pids, guards, store, device, hostnames, heartbeats)

    def dead_shards(self) -> list[str]:
        """Each shard known to be gone: by pid on one host, by its heartbeat with --shard-hosts."""
        if self.heartbeats is None:
            return [f"shard {r} (pid {p}) exited" for r, p in enumerate(self.pids, start=1) if not pid_alive(p)]
        return [f"shard {r} (pid {self.pids[r - 1]} on {self.hosts[r - 1]}) silent for {silent:.0f}s "
                "(TGI_SHARD_HEARTBEAT_TIMEOUT_S)" for r, silent in self.heartbeats.silent()]

    def cache_config(self, config: ModelConfig) -> ModelConfig:
        return local_config(config, self.shard.world_size)

    def connect(self, num_blocks: int, block_size: int) -> None:
        """Wait for every shard to load its slice, join the process groups, send the KV-cache geometry.
        On failure the shards are stopped before the error propagates."""
        try:
            self._connect(num_blocks, block_size)
        except BaseException as exc:
            self.fail(f"start-up failed: {exc}")
            self.stop()
            raise

    def _connect(self, num_blocks: int, block_size: int) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        ready = [f"tgi/ready/{r}" for r in range(1, self.shard.world_size)]
        while not self.store.check(ready):
            for r in range(1, self.shard.world_size):
                if self.store.check([f"tgi/error/{r}"]):
                    raise RuntimeError(f"shard {r} failed to start: {self.store.get(f'tgi/error/{r}').decode()}")
            dead = self.dead_shards()
            if dead:
                raise RuntimeError(f"{'; '.join(dead)} during start-up")
            if time.monotonic() > deadline:
                raise TimeoutError(f"shards not ready after {START_TIMEOUT_S:.0f}s (TGI_SHARD_START_TIMEOUT_S)")
            time.sleep(POLL_S)
        plan_group = init_groups(self.store, 0, self.shard.world_size, self.device, COLLECTIVE_TIMEOUT_S,
                                 loopback=self.heartbeats is None)
        self.channel = PlanChannel(plan_group)
        self.channel.send(SETUP, torch.tensor([num_blocks, block_size], dtype=torch.int32))

    # ---- failure ----
    def on_failure(self, callback: Callable[[str], None]) -> None:
        """`callback(reason)` runs once, on whichever thread sees the failure first."""
        self._callbacks.append(callback)

    def fail(self, reason: str) -> str:
        """Record the first failure (naming a dead shard if there is one) and tell the callbacks."""
        with self._lock:
            if self.failure is not None:
                return self.failure
            # A killed peer's sockets close a moment before /proc shows it gone: look again briefly. (A heartbeat
            # takes seconds to miss: once is enough.)
            deadline = time.monotonic() + (1.0 if self.heartbeats is None else 0.0)
            while True:
                try:
                    dead = self.dead_shards()
                except Exception:  # the heartbeats unreadable: the reason stands alone
                    dead = []
                if dead or time.monotonic() > deadline:
                    break
                time.sleep(0.02)
            self.failure = "; ".join(dead) or reason
        logger.error("sharded model failed: %s", self.failure)
        for callback in self._callbacks:
            try:
                callback(self.failure)
            except Exception:
                logger.exception("shard failure callback failed")
        return self.failure

    def _watch(self) -> None:
        """Notice a shard dying while no step is running (a step notices by itself)."""
        while not self._stopping.wait(POLL_S):
            try:
                dead = self.failure is None and self.dead_shards()
            except Exception as exc:  # reading the heartbeats off this process's own store
                if not self._stopping.is_set():
                    self.fail(f"cannot read the shards' heartbeats: {exc}")
                return
            if dead:
                self.fail("a shard process exited")

    # ---- shutdown ----
    def stop(self, timeout: float | None = None) -> None:
        """Ask every shard to exit, kill what is left after `timeout` (10 s; 2 s after a failure, when
        a hung shard will not go by itself), leave torch.distributed."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        if timeout is None:
            timeout = 10.0 if self.failure is None else 2.0
        if self.heartbeats is not None:
            # A shard on another host cannot be killed from here: its heartbeat sees this key and gives it
            # `HEARTBEAT_TIMEOUT_S` to exit by itself (it does at once on STOP; a hung one, after that).
            self.store.set("tgi/stop", "1")
        if self.channel is not None and self.failure is None:
            try:
                self.channel.send(STOP)
            except Exception as exc:  # a shard already gone: the kill below covers it
                logger.warning("stop message not delivered: %s", exc)
        if not _wait_gone(self.local_pids, timeout):
            left = [p for p in self.local_pids if pid_alive(p)]
            logger.warning("killing shard processes %s that did not stop", left)
            _kill_all(left)
        # A guard exits by itself once its shard is gone; killing it would cost this process its MPI.
        if not _wait_gone(self.local_guards, 10.0):
            global _SPAWN_BROKEN
            _SPAWN_BROKEN = f"shard guard processes {self.local_guards} had to be killed"
            _kill_all(self.local_guards)
        self._finalizer.detach()
        destroy_groups()


def _python() -> str:
    """The interpreter for shard processes. In Triton's stub `sys.executable` may not be Python."""
    if os.environ.get("TGI_SHARD_PYTHON"):
        return os.environ["TGI_SHARD_PYTHON"]
    if Path(sys.executable).name.startswith("python"):
        return sys.executable
    candidate = Path(sys.prefix) / "bin" / "python3"
    return str(candidate) if candidate.exists() else (shutil.which("python3") or "python3")


@contextmanager
def _mpiexec_shim() -> Iterator[None]:
    """Put an `mpiexec` first on PATH that starts hydra's real one in a session of its own.

    MPICH starts `mpiexec` (found on PATH) on the first Spawn; hydra later kills that process's group if
    an MPI process dies uncleanly, and that group would otherwise be ours (tritonserver's, in Triton).
    Also makes the `mpich` wheel's mpiexec findable when PATH lacks the venv's bin (Triton's stub)."""
    search = os.pathsep.join([str(Path(sys.prefix) / "bin"), str(Path(_python()).parent), os.environ.get("PATH", "")])
    real = shutil.which("mpiexec.hydra", path=search)
    if real is None:
        logger.warning("mpiexec.hydra not found: shard processes share this process's group")
        yield
        return
    tmp = tempfile.mkdtemp(prefix="tgi-llm-mpiexec-")
    shim = Path(tmp) / "mpiexec"
    # The shim removes its own directory once run: a Spawn that never returns (shards that cannot start)
    # leaves this thread waiting in it, and the finally below never runs.
    shim.write_text(f"#!/bin/sh\nrm -rf {shlex.quote(tmp)}\nexec {shlex.quote(_python())} -S -c 'import os, sys; "
                    f"os.setsid(); os.execv(sys.argv[1], sys.argv[1:])' {shlex.quote(real)} \"$@\"\n", encoding="utf-8")
    shim.chmod(0o755)
    saved = {k: os.environ.get(k) for k in ("PATH", "PYTHONPATH")}
    os.environ["PATH"] = os.pathsep.join([tmp, saved["PATH"] or ""])
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in [str(PACKAGE_ROOT), saved["PYTHONPATH"]] if p)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        shutil.rmtree(tmp, ignore_errors=True)


def spawn_info(hosts: ShardHosts | None) -> dict[str, str]:
    """The MPI_Comm_spawn info keys: none without --shard-hosts (MPI's default: every rank on this host); else
    the placement, and the package root as working directory (it exists on every host, as it must)."""
    return hosts.spawn_info(str(PACKAGE_ROOT)) if hosts else {}


def _spawn(setup: ShardSetup, hosts: ShardHosts | None = None) -> tuple[list[int], list[int], list[str]]:
    """Start ranks 1..N-1 (on `hosts`, else here) and hand them `setup`; returns the pids of their shard
    processes and of the MPI-facing guards that wait on them (see shard_main), and the host of each.

    MPI_Comm_spawn waits for the children to connect, forever if one cannot start (a wrong Python, a
    broken install): the hand-shake runs on a thread and a timeout turns that into an error."""
    result: dict[str, object] = {}

    def run() -> None:
        try:
            result["pids"] = _spawn_and_handshake(setup, spawn_info(hosts))
        except BaseException as exc:
            result["error"] = exc

    thread = threading.Thread(target=run, name="tgi-shard-spawn", daemon=True)
    thread.start()
    thread.join(SPAWN_TIMEOUT_S)
    unlink_mapped_segments()  # also when the spawn hangs or fails: MPI init has made this process's segment
    if thread.is_alive():
        global _SPAWN_BROKEN
        _SPAWN_BROKEN = "an earlier spawn never completed"
        remote = (f"; on every host of `shard_hosts` ({', '.join(h.host for h in hosts.hosts)}), reached by "
                  "MPICH's hydra over ssh without a password (or HYDRA_LAUNCHER), at the same path") if hosts else ""
        raise RuntimeError(f"shard processes did not start within {SPAWN_TIMEOUT_S:.0f}s: `{_python()} -m "
                           f"tgi_llm.parallel.shard_main` must run{remote} (TGI_SHARD_PYTHON names the Python to "
                           "use)")
    if "error" in result:
        raise result["error"]  # type: ignore[misc]
    return result["pids"]  # type: ignore[return-value]


def _spawn_and_handshake(setup: ShardSetup, info: dict[str, str]) -> tuple[list[int], list[int], list[str]]:
    """MPI is imported here only. `info`: the MPI_Comm_spawn info keys (none on one host)."""
    import mpi4py

    mpi4py.rc.finalize = False  # MPI_Finalize at exit crashes once a spawned rank has died
    from mpi4py import MPI

    mpi_info = MPI.INFO_NULL
    if info:
        mpi_info = MPI.Info.Create()
        for key, value in info.items():
            mpi_info.Set(key, value)
    try:
        with _mpiexec_shim():
            inter = MPI.COMM_SELF.Spawn(_python(), args=["-m", "tgi_llm.parallel.shard_main",
                                                         f"--parent={os.getpid()}"],
                                        maxprocs=setup.world_size - 1, info=mpi_info)
    finally:
        if info:
            mpi_info.Free()
    try:
        comm = inter.Merge(high=False)  # rank 0 here, shards 1..N-1 in spawn order
        comm.bcast(asdict(setup), root=0)  # plain values: the shard's MPI side never imports torch
        # Every rank learns every rank's host: a shard's GPU is its index among the ranks on its host.
        ranks = comm.allgather((os.getpid(), os.getpid(), socket.gethostname()))[1:]
        guards, shards, hostnames = zip(*ranks, strict=True)
        comm.Disconnect()
    finally:
        inter.Disconnect()
    unlink_mapped_segments()
    return list(shards), list(guards), list(hostnames)
