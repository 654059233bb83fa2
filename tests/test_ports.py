from __future__ import annotations

import socket

from tgi_llm.ports import free_ports, promised_ports


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


def test_promised_ports_are_read_from_launcher_flags():
    flags = ["--model-id", "m", "--port", "3000", "--metrics-port", "9100", "--max-total-tokens", "512"]
    assert promised_ports(flags) == {3000, 9100}
