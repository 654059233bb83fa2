"""KV events from a real server, read as a prefix-aware router reads them: a pyzmq SUB socket bound first
(llm-d's wiring: engines connect to the router), vLLM's msgpack frames decoded, the server's prefix cache
rebuilt from the events alone, and that rebuilt cache checked against what the server itself reports:
the cached tokens of each request, the cached-block gauge when idle, through evictions; plus a replay."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import msgpack
import pytest
import zmq
from transformers import AutoTokenizer

from tgi_llm.ports import free_ports

from .conftest import serving
from .harness import grpc_generate, metric, read_metrics, wait_until

BLOCK = 16
POOL_BLOCKS = 64  # --max-batch-total-tokens 1024: a few prompts evict the first ones


@dataclass
class RouterView:
    """The cache as events tell it: block hash -> (parent hash, its tokens); and every batch's number."""

    blocks: dict[int, tuple[int | None, tuple[int, ...]]] = field(default_factory=dict)
    seqs: list[int] = field(default_factory=list)
    removed: int = 0
    topics: set[bytes] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def apply(self, seq: int, payload: bytes) -> None:
        ts, events = msgpack.unpackb(payload)
        assert isinstance(ts, float)
        with self.lock:
            self.seqs.append(seq)
            for event in events:
                if event[0] == "BlockStored":
                    _, hashes, parent, tokens, block_size, _lora_id, medium, _lora_name = event
                    assert block_size == BLOCK and medium == "CPU" and len(tokens) == BLOCK * len(hashes)
                    for i, h in enumerate(hashes):
                        self.blocks[h] = (parent, tuple(tokens[i * BLOCK : (i + 1) * BLOCK]))
                        parent = h
                elif event[0] == "BlockRemoved":
                    for h in event[1]:
                        del self.blocks[h]
                    self.removed += len(event[1])
                elif event[0] == "AllBlocksCleared":
                    self.blocks.clear()

    def cached_prefix(self, token_ids: list[int]) -> int:
        """What a router predicts the server will find cached: full blocks chained from the root by token ids
        (never the prompt's last token: the server computes it to get logits)."""
        with self.lock:
            by_content = {(parent, tokens): h for h, (parent, tokens) in self.blocks.items()}
        parent, n = None, 0
        while (n + 1) * BLOCK <= len(token_ids) - 1:
            h = by_content.get((parent, tuple(token_ids[n * BLOCK : (n + 1) * BLOCK])))
            if h is None:
                break
            parent, n = h, n + 1
        return n * BLOCK


@pytest.fixture(scope="module")
def events_server(tmp_path_factory, tiny_llama_dir):
    events_port, replay_port = free_ports(2)
    context = zmq.Context.instance()
    sub = context.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"kv@")
    sub.setsockopt(zmq.RCVTIMEO, 200)
    sub.setsockopt(zmq.LINGER, 0)
    sub.bind(f"tcp://127.0.0.1:{events_port}")
    view, stop = RouterView(), threading.Event()

    def listen() -> None:
        while not stop.is_set():
            try:
                topic, seq, payload = sub.recv_multipart()
            except zmq.Again:
                continue
            view.topics.add(topic)
            view.apply(int.from_bytes(seq, "big"), payload)

    listener = threading.Thread(target=listen, daemon=True)
    listener.start()
    flags = ("--model-id", str(tiny_llama_dir), "--max-input-tokens", "400", "--max-total-tokens", "512",
             "--max-batch-total-tokens", str(POOL_BLOCKS * BLOCK), "--kv-events-endpoint",
             f"tcp://127.0.0.1:{events_port}", "--kv-events-replay-endpoint", f"tcp://127.0.0.1:{replay_port}",
             "--kv-events-topic", "kv@127.0.0.1@tiny")
    try:
        for server in serving(tmp_path_factory.mktemp("kv-events"), *flags):
            yield server, view, replay_port
    finally:
        stop.set()
        listener.join(5)
        sub.close()


def prompt(i: int) -> str:
    return f"Conversation {i}: " + " ".join(f"item{i}x{j}" for j in range(40))


def settled(server, view: RouterView, tokens: list[int]) -> bool:
    """The events of a finished request have arrived (its prompt's blocks are in the view), and, the server
    being idle, every registered block is cached-free: the gauge counts exactly the blocks announced."""
    return view.cached_prefix(tokens) == (len(tokens) - 1) // BLOCK * BLOCK and \
        metric(read_metrics(server), "tgi_kv_blocks_cached") == len(view.blocks)


def test_the_events_rebuild_the_cache_through_evictions(events_server, tiny_llama_dir):
    server, view, _ = events_server
    tokenizer = AutoTokenizer.from_pretrained(tiny_llama_dir)
    first = tokenizer(prompt(0))["input_ids"]
    assert len(first) > 5 * BLOCK
    reply = grpc_generate(server, prompt(0), max_new_tokens=1)
    assert reply.error is None and reply.num_cached_tokens == 0
    # The events carry the prompt's own token ids: a router predicts the next hit from them alone.
    assert wait_until(lambda: settled(server, view, first), 10), (len(view.blocks), view.seqs)
    again = grpc_generate(server, prompt(0), max_new_tokens=1)
    assert again.num_cached_tokens == view.cached_prefix(first)

    for i in range(1, 12):  # other conversations fill the 64-block pool: the first one's blocks go
        tokens = tokenizer(prompt(i))["input_ids"]
        expected = view.cached_prefix(tokens)
        reply = grpc_generate(server, prompt(i), max_new_tokens=1)
        assert reply.error is None and reply.num_cached_tokens == expected
        assert wait_until(lambda: settled(server, view, tokens), 10), (len(view.blocks), i)  # noqa: B023
    assert view.removed > 0 and view.cached_prefix(first) == 0
    assert len(view.blocks) <= POOL_BLOCKS
    evicted = grpc_generate(server, prompt(0), max_new_tokens=1)
    assert evicted.num_cached_tokens == 0  # as the events said: gone
    with view.lock:
        seqs = list(view.seqs)
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), "a gap in the sequence numbers"
    assert view.topics == {b"kv@127.0.0.1@tiny"}


def test_a_replay_resends_every_batch_from_the_first(events_server):
    server, view, replay_port = events_server
    assert wait_until(lambda: len(view.seqs) > 0, 10)
    dealer = zmq.Context.instance().socket(zmq.DEALER)
    dealer.setsockopt(zmq.RCVTIMEO, 5000)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(f"tcp://127.0.0.1:{replay_port}")
    try:
        dealer.send_multipart([b"", (0).to_bytes(8, "big")])
        replayed = []
        while True:
            _, seq, payload = dealer.recv_multipart()
            if seq == (-1).to_bytes(8, "big", signed=True):
                break
            replayed.append((int.from_bytes(seq, "big"), msgpack.unpackb(payload)[1]))
    finally:
        dealer.close()
    # Batch 0 is the start-up's AllBlocksCleared, whether or not the live subscription caught it.
    assert replayed[0] == (0, [["AllBlocksCleared"]])
    assert [s for s, _ in replayed] == list(range(len(replayed)))
    with view.lock:
        assert set(view.seqs) <= {s for s, _ in replayed}
