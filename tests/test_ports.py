from __future__ import annotations

import socket

from tgi_llm.ports import free_ports


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
