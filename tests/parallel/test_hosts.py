"""--shard-hosts and --shard-master-addr: MPICH's hostfile and host-list formats, the checks against
--num-shard, the MPI_Comm_spawn info they become, and each rank's GPU index on its host."""

from __future__ import annotations

import os

import pytest

from tgi_llm.engine.options import EngineOptions
from tgi_llm.parallel.hosts import HostSlots, check_shard_hosts, local_ranks, parse_shard_hosts

WDIR = "/opt/tgi-llm"


def test_a_host_list_takes_slots_per_host_and_becomes_the_host_info_key():
    hosts = parse_shard_hosts("node1, node2:2,10.0.0.7:3")
    assert hosts.hosts == (HostSlots("node1", 1), HostSlots("node2", 2), HostSlots("10.0.0.7", 3))
    assert hosts.slots == 6 and hosts.hostfile is None
    assert hosts.spawn_info(WDIR) == {"host": "node1:1,node2:2,10.0.0.7:3", "wdir": WDIR}


def test_an_mpich_hostfile_is_checked_here_and_handed_to_mpi_by_absolute_path(tmp_path, monkeypatch):
    (tmp_path / "hosts").write_text("# GPU nodes\n\n  node1:2   # first two shard ranks\nnode2 user=svc\n"
                                    "node3:1 binding=user:0\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    hosts = parse_shard_hosts("hosts")  # relative: the model process runs elsewhere, MPI gets the full path
    assert hosts.hosts == (HostSlots("node1", 2), HostSlots("node2", 1), HostSlots("node3", 1))
    assert hosts.hostfile == str(tmp_path / "hosts")
    assert hosts.spawn_info(WDIR) == {"hostfile": str(tmp_path / "hosts"), "wdir": WDIR}


@pytest.mark.parametrize("text,problem", [
    ("", "names no host"),
    ("# only a comment\n", "names no host"),
    ("node1:two\n", "line 1: slots must be a whole number >= 1"),
    ("node1\nnode2:0\n", "line 2: slots must be a whole number >= 1"),
    ("node1 slots=4\n", "line 1: MPICH's hostfile takes `host[:slots]` and optionally user=NAME or binding=..., "
                        "not 'slots=4'"),
    ("[fe80::1]\n", "line 1: '[fe80' is not a host name"),
])
def test_a_bad_hostfile_is_refused_naming_the_flag_the_line_and_the_problem(tmp_path, text, problem):
    path = tmp_path / "hosts"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ValueError, match="`shard_hosts`") as info:
        parse_shard_hosts(str(path))
    assert problem in str(info.value)
    assert str(path) in str(info.value)


@pytest.mark.parametrize("value,problem", [
    ("node1,,node2", "host[:slots] entries separated by commas"),
    ("node1,", "host[:slots] entries separated by commas"),
    ("node1:0", "slots must be a whole number >= 1"),
    ("node1:-2", "slots must be a whole number >= 1"),
    ("node 1", "'node 1' is not a host name"),
    ("/no/such/hostfile", "no MPI hostfile at /no/such/hostfile"),
])
def test_a_bad_host_list_or_missing_file_is_refused(value, problem):
    with pytest.raises(ValueError, match="`shard_hosts`") as info:
        parse_shard_hosts(value)
    assert problem in str(info.value)


def test_a_directory_is_not_a_hostfile(tmp_path):
    with pytest.raises(ValueError, match=f"no MPI hostfile at {tmp_path}"):
        parse_shard_hosts(str(tmp_path))


def test_the_flags_are_checked_against_num_shard():
    assert check_shard_hosts(None, None, 4) is None  # nothing given: every rank on this host
    assert check_shard_hosts("a:2,b", None, 4).slots == 3  # ranks 1..3; rank 0 is this host, outside the list
    assert check_shard_hosts("a:5", "10.1.2.3", 2).slots == 5  # more slots than ranks: the first ones are used
    with pytest.raises(ValueError, match=r"`shard_hosts` places shard ranks 1..N-1 and needs `num_shard` > 1. "
                                         r"Given: 1"):
        check_shard_hosts("a", None, 1)
    with pytest.raises(ValueError, match=r"`shard_hosts` has 2 slot\(s\) for the 3 shard ranks of `num_shard` 4 "
                                         r"\(rank 0 runs on this host"):
        check_shard_hosts("a,b", None, 4)
    with pytest.raises(ValueError, match="`shard_master_addr` .* needs `shard_hosts`"):
        check_shard_hosts(None, "10.1.2.3", 2)
    with pytest.raises(ValueError, match="`shard_master_addr` must be a host name or IPv4 address"):
        check_shard_hosts("a", "tcp://10.1.2.3:5", 2)


def test_engine_options_refuse_what_the_launcher_refuses(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("a\nb\n", encoding="utf-8")
    opts = EngineOptions.from_parameters({"num_shard": "3", "shard_hosts": str(hostfile), "shard_master_addr": ""})
    assert (opts.shard_hosts, opts.shard_master_addr) == (str(hostfile), None)
    with pytest.raises(ValueError, match="`shard_hosts` has 2 slot"):
        EngineOptions(num_shard=4, shard_hosts=str(hostfile))
    with pytest.raises(ValueError, match="needs `num_shard` > 1"):
        EngineOptions.from_parameters({"num_shard": "1", "shard_hosts": "a"})


def test_a_ranks_gpu_is_its_index_among_the_ranks_on_its_host():
    assert local_ranks(["n0", "n0", "n0"]) == [0, 1, 2]  # one host: the rank itself (cuda:r)
    assert local_ranks(["n0", "n1", "n1", "n0", "n2"]) == [0, 0, 1, 1, 0]  # rank 0 holds n0's first GPU


def test_spawn_info_is_empty_on_one_host_and_places_ranks_from_the_package_root_on_many():
    """Without --shard-hosts the spawn and setup are what they always were: no info (MPI's default places every
    rank here), the store on 127.0.0.1, pid watching, gloo on `lo`."""
    from tgi_llm.parallel.launch import PACKAGE_ROOT, ShardSetup, spawn_info

    assert spawn_info(None) == {}
    setup = ShardSetup("m", "float32", "cpu", 2, 1234, os.getpid(), 1, 30.0, 600.0)
    assert (setup.store_host, setup.multi_host) == ("127.0.0.1", False)
    assert spawn_info(parse_shard_hosts("a:2,b")) == {"host": "a:2,b:1", "wdir": str(PACKAGE_ROOT)}
    assert os.path.isdir(spawn_info(parse_shard_hosts("a"))["wdir"])
