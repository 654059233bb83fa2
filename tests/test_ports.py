from __future__ import annotations

import socket

import pytest

from tgi_llm.ports import LOWEST_PORT, ephemeral_low, free_ports, promised_ports


def test_ports_are_distinct_and_bindable():
    ports = free_ports(8)
    assert len(set(ports)) == 8
    for port in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_excluded_ports_are_never_returned():
    taken = set(free_ports(50))
    ports = free_ports(20, exclude=taken)
    assert len(ports) == 20 and not taken & set(ports)


def test_ports_lie_below_the_ephemeral_range_that_port_0_binds_draw_from():
    """A released port there could be taken by any bind to port 0 (MPI ranks, tritonserver's own) before
    its listener binds it."""
    if ephemeral_low() - LOWEST_PORT < 1000:
        pytest.skip("no room below this kernel's ephemeral range: free_ports takes the kernel's ports")
    ports = free_ports(16)
    assert all(LOWEST_PORT <= p < ephemeral_low() for p in ports)
    with socket.socket() as kernel_drawn:
        kernel_drawn.bind(("127.0.0.1", 0))
        assert kernel_drawn.getsockname()[1] >= ephemeral_low()


def test_promised_ports_are_read_from_launcher_flags():
    flags = ["--model-id", "m", "--port", "3000", "--metrics-port", "9100", "--max-total-tokens", "512"]
    assert promised_ports(flags) == {3000, 9100}
