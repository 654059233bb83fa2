"""Entry point of shard ranks 1..N-1: `python -m tgi_llm.parallel.shard_main` (spawned over MPI by rank 0).

The spawned process forks at once into a guard and the shard proper. The guard does the MPI hand-shake,
passes the setup down a pipe and waits; the shard loads this rank's slice of the weights and forwards
every plan rank 0 broadcasts until told to stop. The guard exists because MPICH's process manager takes
a rank that dies by a signal (SIGKILL, a segfault, the OOM killer) as the job failing, and rank 0's next
`Spawn` then crashes; the guard turns any death of the shard into a plain exit. The shard exits when
rank 0 or the guard disappears, and on any error (rank 0 notices through a failed collective or its
liveness watch). On one host the shard watches rank 0's pid; with --shard-hosts rank 0 may be on another
host, and a heartbeat thread on rank 0's store stands in for the pid on both sides (`_heartbeat`).
"""

from __future__ import annotations

import logging
import os
import pickle
import signal
import socket
import sys
import threading
import time
import traceback
from typing import TYPE_CHECKING

from tgi_llm.parallel.mpi_shm import unlink_mapped_segments

if TYPE_CHECKING:
    from tgi_llm.parallel.launch import ShardSetup

logger = logging.getLogger("tgi_llm.parallel.shard")


def _handshake(shard_pid: int) -> tuple[int, dict, list[str]]:
    import mpi4py

    mpi4py.rc.finalize = False  # see _leave_pmi: MPI is done with once the hand-shake is over
    from mpi4py import MPI

    parent = MPI.Comm.Get_parent()
    if parent == MPI.COMM_NULL:
        raise SystemExit("tgi_llm.parallel.shard_main is started by rank 0 over MPI, not by hand")
    comm = parent.Merge(high=True)
    setup = comm.bcast(None, root=0)
    hostnames = [host for _, _, host in comm.allgather((os.getpid(), shard_pid, socket.gethostname()))]
    rank = comm.Get_rank()
    comm.Disconnect()
    parent.Disconnect()
    _leave_pmi()
    unlink_mapped_segments()
    return rank, setup, hostnames


def _leave_pmi() -> None:
    """Tell hydra's proxy this process is finished with PMI (the PMI-1 wire `finalize`).

    MPICH sends it only at process exit, and until then the proxy treats this process dying as the
    whole job failing: it SIGKILLs every process of the job, rank 0's process group included. After it,
    a shard that dies is noticed by rank 0 alone. Only for the simple PMI-1 fd wire MPICH uses here."""
    fd = os.environ.get("PMI_FD")
    if fd is None:
        logger.warning("no PMI_FD: a dying shard may make the MPI process manager kill the job")
        return
    os.write(int(fd), b"cmd=finalize\n")
    reply = os.read(int(fd), 256)
    if b"finalize_ack" not in reply:
        logger.warning("unexpected PMI reply %r", reply)


def _exit_with_parent(parent_pid: int) -> None:
    from tgi_llm.procfs import pid_alive

    while pid_alive(parent_pid):
        time.sleep(0.5)
    logger.error("rank 0 (pid %d) is gone; exiting", parent_pid)
    os._exit(3)


def _heartbeat(setup: ShardSetup, rank: int) -> None:
    """--shard-hosts: bump tgi/beat/<rank> on rank 0's store every HEARTBEAT_S, so that rank 0 can tell this
    shard is alive without seeing its pid. A store that cannot be reached means rank 0 is gone; once rank 0
    has stopped the group (tgi/stop), a shard still running after HEARTBEAT_TIMEOUT_S is hung: exit. Its own
    store connection, so it never waits behind the main thread's."""
    from datetime import timedelta

    import torch.distributed as dist

    from tgi_llm.parallel.launch import HEARTBEAT_S, HEARTBEAT_TIMEOUT_S

    where = f"{setup.store_host}:{setup.store_port}"
    try:
        client = dist.TCPStore(setup.store_host, setup.store_port, is_master=False, wait_for_workers=False,
                               timeout=timedelta(seconds=HEARTBEAT_TIMEOUT_S))
        stopped_at = None
        while True:
            client.add(f"tgi/beat/{rank}", 1)
            if stopped_at is None and client.check(["tgi/stop"]):
                stopped_at = time.monotonic()
            if stopped_at is not None and time.monotonic() - stopped_at > HEARTBEAT_TIMEOUT_S:
                logger.error("still running %.0fs after rank 0 stopped the shards; exiting", HEARTBEAT_TIMEOUT_S)
                os._exit(3)
            time.sleep(HEARTBEAT_S)
    except Exception as exc:
        logger.error("rank 0's store at %s is gone (%s); exiting", where, exc)
        os._exit(3)


def serve(rank: int, setup: ShardSetup, hostnames: list[str] | None = None) -> int:
    """Load, rendezvous, run plans. Returns the exit code."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from tgi_llm.kv_cache import allocate_kv_cache, resolve_kv_cache_dtype
    from tgi_llm.models.loader import load_model
    from tgi_llm.models.rope_override import RopeOverride
    from tgi_llm.parallel.comm import SETUP, STEP, STOP, PlanChannel, destroy_groups, init_groups
    from tgi_llm.parallel.hosts import local_ranks
    from tgi_llm.parallel.launch import local_config
    from tgi_llm.parallel.plan_codec import PlanDecoder
    from tgi_llm.runner.model_runner import ModelRunner
    from tgi_llm.weights.safetensors_loader import Shard

    torch.set_num_threads(setup.threads)
    base = torch.device(setup.device)
    # The rank's index among the ranks on its host (rank 0's included): on one host, the rank itself.
    local = local_ranks(hostnames)[rank] if hostnames else rank
    device = torch.device("cuda", (base.index or 0) + local) if base.type == "cuda" else base
    store = dist.TCPStore(setup.store_host, setup.store_port, setup.world_size, is_master=False,
                          timeout=timedelta(seconds=setup.start_timeout_s))
    if setup.multi_host:
        threading.Thread(target=_heartbeat, args=(setup, rank), name="tgi-shard-heartbeat", daemon=True).start()
    try:
        if device.type == "cuda":  # after the store: a host with too few GPUs is reported to rank 0 by name
            if device.index >= torch.cuda.device_count():
                host = socket.gethostname()
                raise RuntimeError(f"shard {rank} is rank {local} of those on {host} and needs {device}; {host} has "
                                   f"{torch.cuda.device_count()} GPU(s)")
            torch.cuda.set_device(device)
        shard = Shard(rank, setup.world_size)
        from tgi_llm.quant.modes import parse_quantize

        quantization = parse_quantize(setup.quantize or None, setup.quantize_group_size or None)
        rope = RopeOverride.from_flags(setup.rope_scaling or None, setup.rope_factor or None)
        model, config = load_model(setup.model_dir, dtype=getattr(torch, setup.dtype), device=device, shard=shard,
                                   quantization=quantization, rope_override=rope)
        if setup.lora_slots:  # rank 0's plans name the slots and the adapters to read into them
            from tgi_llm.lora.weights import ModelLora

            model.attach_lora(ModelLora.allocate(config, setup.lora_slots, setup.lora_rank, device,
                                                 torch.float32 if device.type == "cpu" else model.dtype, shard))
    except Exception as exc:
        store.set(f"tgi/error/{rank}", f"{type(exc).__name__}: {exc}")
        raise
    store.set(f"tgi/ready/{rank}", "1")
    channel = PlanChannel(init_groups(store, rank, setup.world_size, device, setup.collective_timeout_s,
                                      loopback=not setup.multi_host))
    op, geometry = channel.recv()
    assert op == SETUP, f"expected the KV-cache geometry first, got op {op}"
    num_blocks, block_size = geometry.tolist()
    kv_dtype = resolve_kv_cache_dtype(setup.kv_cache_dtype or None, getattr(torch, setup.dtype))
    caches = allocate_kv_cache(local_config(config, setup.world_size), num_blocks, block_size, kv_dtype, device)
    runner = ModelRunner(model, caches, block_size, config.vocab_size, device)
    decoder = PlanDecoder()
    logger.info("ready: %d KV blocks of %d tokens on %s", num_blocks, block_size, device)
    while True:
        op, payload = channel.recv()
        if op == STOP:
            break
        if op != STEP:
            raise RuntimeError(f"unknown op {op} from rank 0")
        runner.forward_plan(decoder.decode(payload))
    destroy_groups()
    return 0


def _guard(shard_pid: int, pipe: int) -> int:
    """The MPI-facing process: hand-shake, pass the setup on, wait for the shard, exit as it did."""
    try:
        with os.fdopen(pipe, "wb") as f:
            f.write(pickle.dumps(_handshake(shard_pid)))
    except BaseException:
        logger.error("hand-shake with rank 0 failed:\n%s", traceback.format_exc())
        os.kill(shard_pid, signal.SIGKILL)
    _, status = os.waitpid(shard_pid, 0)
    code = os.waitstatus_to_exitcode(status)
    return code if code >= 0 else 128 - code  # died by a signal: report it as an exit code


def _die_with(guard_pid: int) -> None:
    """Have the kernel SIGKILL this process when the guard goes (PR_SET_PDEATHSIG)."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)
    if os.getppid() != guard_pid:  # the guard went before the prctl
        os._exit(3)


def _shard(guard_pid: int, pipe: int) -> int:
    _die_with(guard_pid)
    if os.environ.get("PMI_FD"):  # the guard's line to hydra, not ours
        os.close(int(os.environ["PMI_FD"]))
    with os.fdopen(pipe, "rb") as f:
        data = f.read()
    if not data:
        return 1
    from tgi_llm.parallel.launch import ShardSetup

    rank, fields, hostnames = pickle.loads(data)
    setup = ShardSetup(**fields)
    if not setup.multi_host:  # rank 0 is on this host (else `serve` starts the heartbeat)
        threading.Thread(target=_exit_with_parent, args=(setup.parent_pid,), daemon=True).start()
    return serve(rank, setup, hostnames)


def main() -> None:
    read_end, write_end = os.pipe()
    guard_pid = os.getpid()
    shard_pid = os.fork()  # before MPI is initialized: the shard never touches MPI
    logging.basicConfig(level=os.environ.get("TGI_LOG_LEVEL", "INFO"), stream=sys.stderr,
                        format=f"%(asctime)s %(levelname)s [shard pid {os.getpid()}] %(name)s: %(message)s")
    code = 1
    try:
        if shard_pid == 0:
            os.close(write_end)
            code = _shard(guard_pid, read_end)
        else:
            os.close(read_end)
            code = _guard(shard_pid, write_end)
    except BaseException:
        logger.error("shard failed:\n%s", traceback.format_exc())
    finally:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        # Skip interpreter and MPICH exit handlers: MPICH would redo the PMI finalize on a closed socket.
        os._exit(code)


if __name__ == "__main__":
    main()
