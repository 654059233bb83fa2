"""The ZMQ publisher on real sockets: vLLM's frames and msgpack arrays, sequence numbers, replays, and both
ways of wiring (we bind and routers connect; a router binds and we connect)."""

from __future__ import annotations

import time

import msgpack
import pytest
import zmq

from tgi_llm.engine.kv_event_publisher import END_OF_REPLAY, ZmqKVEventPublisher
from tgi_llm.engine.kv_events import AllBlocksCleared, BlockRemoved, BlockStored
from tgi_llm.ports import free_ports


def subscribe(endpoint: str, bind: bool, topic: bytes = b"") -> zmq.Socket:
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, topic)
    sub.setsockopt(zmq.RCVTIMEO, 5000)
    sub.setsockopt(zmq.LINGER, 0)
    (sub.bind if bind else sub.connect)(endpoint)
    return sub


def publish_until_received(pub: ZmqKVEventPublisher, sub: zmq.Socket, events: list) -> list[bytes]:
    """PUB drops what it sends before a subscription arrives (ZMQ's slow joiner): probe until one lands."""
    sub.setsockopt(zmq.RCVTIMEO, 100)
    for _ in range(50):
        pub.publish([AllBlocksCleared()])
        try:
            sub.recv_multipart()
            break
        except zmq.Again:
            continue
    else:
        pytest.fail("the subscriber never received a probe")
    sub.setsockopt(zmq.RCVTIMEO, 5000)
    pub.publish(events)
    return sub.recv_multipart()


STORED = BlockStored([2**64 - 1, 5], None, list(range(32)), 16, "sql", "CPU")


def test_frames_and_payload_are_vllms():
    (port,) = free_ports(1)
    pub = ZmqKVEventPublisher(f"tcp://*:{port}", topic="kv@10.0.0.1@m")
    sub = subscribe(f"tcp://127.0.0.1:{port}", bind=False, topic=b"kv@")
    try:
        topic, seq, payload = publish_until_received(pub, sub, [STORED, BlockRemoved([5], "CPU")])
    finally:
        pub.close()
        sub.close()
    assert topic == b"kv@10.0.0.1@m" and int.from_bytes(seq, "big") >= 1
    ts, events = msgpack.unpackb(payload)
    assert abs(ts - time.time()) < 60
    assert events == [["BlockStored", [2**64 - 1, 5], None, list(range(32)), 16, None, "CPU", "sql"],
                      ["BlockRemoved", [5], "CPU"]]


def test_sequence_numbers_count_batches_and_a_replay_resends_from_one():
    port, replay_port = free_ports(2)
    sub = subscribe(f"tcp://127.0.0.1:{port}", bind=True)  # llm-d's way: the router binds, engines connect
    pub = ZmqKVEventPublisher(f"tcp://127.0.0.1:{port}", replay_endpoint=f"tcp://*:{replay_port}")
    try:
        _, first, _ = publish_until_received(pub, sub, [STORED])
        for n in range(3):
            pub.publish([BlockRemoved([n])])
        seqs = [int.from_bytes(sub.recv_multipart()[1], "big") for _ in range(3)]
        start = int.from_bytes(first, "big")
        assert seqs == [start + 1, start + 2, start + 3]
        # A DEALER, not a REQ: one request is answered with many messages (REQ would take only the first).
        req = zmq.Context.instance().socket(zmq.DEALER)
        req.setsockopt(zmq.RCVTIMEO, 5000)
        req.setsockopt(zmq.LINGER, 0)
        req.connect(f"tcp://127.0.0.1:{replay_port}")
        req.send_multipart([b"", (start + 2).to_bytes(8, "big")])
        replayed = []
        while True:
            _, seq, payload = req.recv_multipart()
            if seq == END_OF_REPLAY:
                break
            replayed.append((int.from_bytes(seq, "big"), msgpack.unpackb(payload)[1]))
        req.close()
    finally:
        pub.close()
        sub.close()
    assert replayed == [(start + 2, [["BlockRemoved", [1], None]]), (start + 3, [["BlockRemoved", [2], None]])]


def test_a_malformed_replay_request_is_ignored_and_publishing_goes_on():
    port, replay_port = free_ports(2)
    pub = ZmqKVEventPublisher(f"tcp://*:{port}", replay_endpoint=f"tcp://*:{replay_port}")
    sub = subscribe(f"tcp://127.0.0.1:{port}", bind=False)
    dealer = zmq.Context.instance().socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(f"tcp://127.0.0.1:{replay_port}")
    try:
        dealer.send_multipart([b"", b"not eight bytes"])
        dealer.send_multipart([b"x", b"y", b"z", b"w"])
        _, _, payload = publish_until_received(pub, sub, [STORED])
        assert msgpack.unpackb(payload)[1][0][0] == "BlockStored"
    finally:
        dealer.close()
        pub.close()
        sub.close()


def test_an_endpoint_in_use_fails_at_once_and_leaves_no_socket():
    port, other = free_ports(2)
    first = ZmqKVEventPublisher(f"tcp://*:{port}")
    try:
        with pytest.raises(zmq.ZMQError):
            ZmqKVEventPublisher(f"tcp://*:{other}", replay_endpoint=f"tcp://*:{port}")
        with pytest.raises(zmq.ZMQError):
            ZmqKVEventPublisher(f"tcp://*:{port}")
    finally:
        first.close()
