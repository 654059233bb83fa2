"""Publish KV-cache events over ZMQ exactly as vLLM does, so llm-d, Dynamo and vLLM's own subscriber read them.

Wire format (vLLM's `ZmqEventPublisher` with its msgspec structs in array form):

* each message is three frames: the topic (`--kv-events-topic`, default empty), the batch's sequence number
  (8 bytes, big-endian, from 0 and +1 per batch: a subscriber that sees a jump lost batches), and the msgpack
  payload `[ts, [event, ...]]`;
* events are tagged arrays: `["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id,
  medium, lora_name]`, `["BlockRemoved", block_hashes, medium]`, `["AllBlocksCleared"]`;
* with a replay endpoint, a ROUTER socket answers a request frame holding a start sequence number (8 bytes,
  big-endian) with every buffered batch from there as `[seq, payload]` frames, then `[-1, b""]`.

The engine thread only queues a batch; this module's thread encodes and sends it, so a slow or absent
subscriber never delays a step (ZMQ drops what exceeds the high-water mark, and the sequence numbers tell).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Sequence
from itertools import count

import msgpack
import zmq

from tgi_llm.engine.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent, binds

logger = logging.getLogger(__name__)

END_OF_REPLAY = (-1).to_bytes(8, "big", signed=True)


def encode_event(event: KVEvent) -> list:
    if isinstance(event, BlockStored):
        return ["BlockStored", event.block_hashes, event.parent_block_hash, event.token_ids, event.block_size,
                None, event.medium, event.lora_name]
    if isinstance(event, BlockRemoved):
        return ["BlockRemoved", event.block_hashes, event.medium]
    if isinstance(event, AllBlocksCleared):
        return ["AllBlocksCleared"]
    raise TypeError(f"not a KV event: {event!r}")


def encode_batch(ts: float, events: Sequence[KVEvent]) -> bytes:
    return msgpack.packb([ts, [encode_event(e) for e in events]], use_bin_type=True)


class ZmqKVEventPublisher:
    """A PUB socket (and an optional ROUTER for replays) served by one daemon thread."""

    POLL_S = 0.05

    def __init__(self, endpoint: str, replay_endpoint: str | None = None, topic: str = "",
                 buffer_batches: int = 10_000, hwm: int = 100_000) -> None:
        self._ctx = zmq.Context.instance()
        self._pub = self._ctx.socket(zmq.PUB)
        self._replay: zmq.Socket | None = None
        try:
            self._pub.set_hwm(hwm)
            self._pub.setsockopt(zmq.LINGER, 0)
            if binds(endpoint):
                self._pub.bind(endpoint)
            else:  # a router's SUB socket listens; we are one of many publishers connecting to it
                self._pub.connect(endpoint)
            if replay_endpoint:
                self._replay = self._ctx.socket(zmq.ROUTER)
                self._replay.setsockopt(zmq.LINGER, 0)
                self._replay.bind(replay_endpoint)
        except zmq.ZMQError:
            self._close_sockets()
            raise
        self._topic = topic.encode()
        self._queue: queue.SimpleQueue[tuple[float, list[KVEvent]] | None] = queue.SimpleQueue()
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_batches)
        self._seq = count()
        self._thread = threading.Thread(target=self._run, name="tgi-kv-events", daemon=True)
        self._thread.start()
        logger.info("KV events: publishing on %s%s", endpoint,
                    f", replays on {replay_endpoint}" if replay_endpoint else "")

    def publish(self, events: list[KVEvent]) -> None:
        """Queue one batch (any thread); never blocks."""
        if events:
            self._queue.put((time.time(), events))

    def close(self, timeout: float = 2.0) -> None:
        """Send what is queued, then close the sockets."""
        self._queue.put(None)
        self._thread.join(timeout)
        self._close_sockets()

    def _close_sockets(self) -> None:
        for sock in (self._pub, self._replay):
            if sock is not None:
                sock.close(linger=0)

    # ---- the publisher thread ----
    def _run(self) -> None:
        while True:
            if self._replay is not None and self._replay.poll(0):
                try:
                    self._serve_replay()
                except Exception:  # one client's replay must not end the publishing
                    logger.exception("KV events: a replay failed")
            try:
                item = self._queue.get(timeout=self.POLL_S)
            except queue.Empty:
                continue
            if item is None:
                return
            try:
                payload = encode_batch(*item)
                seq = next(self._seq)
                self._pub.send_multipart((self._topic, seq.to_bytes(8, "big"), payload))
                self._buffer.append((seq, payload))
            except Exception:  # a bad batch is lost (the gap shows in the sequence); the next one goes out
                logger.exception("KV events: could not publish a batch")

    def _serve_replay(self) -> None:
        assert self._replay is not None
        frames = self._replay.recv_multipart()
        if len(frames) != 3 or len(frames[2]) != 8:
            logger.warning("KV events: ignored a malformed replay request (%d frames)", len(frames))
            return
        client, _, start = frames
        first = int.from_bytes(start, "big")
        for seq, payload in list(self._buffer):
            if seq >= first:
                self._replay.send_multipart((client, b"", seq.to_bytes(8, "big"), payload))
        self._replay.send_multipart((client, b"", END_OF_REPLAY, b""))
