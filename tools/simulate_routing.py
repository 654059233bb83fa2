"""Simulate a pool of replicas behind a router: round-robin, least queue, and prefix affinity from KV events.

    python tools/simulate_routing.py                                  # both scenarios, 4 replicas
    python tools/simulate_routing.py --replicas 2 4 8 --seed 0        # the tables in docs/ROUTING.md
    python tools/simulate_routing.py --scenario chat --record chat.jsonl
    python tools/simulate_routing.py --trace chat.jsonl --replicas 4  # replay a recorded (or real) trace

Why: a router in front of several replicas (llm-d's endpoint picker, NVIDIA Dynamo's KV router) can send a
request where its prompt's prefix is already cached, if it knows what each replica caches. Our replicas
announce that as KV events (tgi_llm/engine/kv_events.py). This tool estimates what that buys, and what it
risks, before anyone runs a real pool: same trace, same replicas, only the routing policy differs.

The replicas. Each is a continuous batcher over the real prefix cache: a `KVCacheManager` (block size 16,
LRU eviction of unheld cached blocks) with the real chained block hashes. Its step mirrors the engine's
chunked-prefill scheduler (scheduler.py): running decodes first (one token each), then prompts still
being prefilled, then waiting requests, shortest estimated prefill first with ageing (the server's default
`--scheduling-policy`); prompt tokens per step capped at 512 (the CPU default) and, while streams decode,
paced to a 300 ms step target with the real `StepBudget` (pacing.py), never below one block. A request is
admitted only when every block its life can fill fits (allocate returns None: it waits, and so does every
request behind it); its cached prompt blocks are not computed; its blocks are freed when it finishes.

The time model: a step takes a + b * prompt tokens + c * decoding sequences. The defaults are the default
model (SmolLM2-135M, Q4_1) on 2 vCPUs of an AMD EPYC Zen 4, from docs/PERFORMANCE.md:
- a = 4.0 ms and c = 2.4 ms from the LoRA table (base model, `--speculate 0`): 1 stream 156.6 tok/s is
  6.39 ms a step, 16 streams 375.9 tok/s is 42.6 ms a step; c = (42.6 - 6.39) / 15, a = 6.39 - c.
- b = 1.8 ms per prompt token from W4 on the same machine: a 1,500-token prompt's TTFT was 2.80 / 3.06 s
  beside 8 decoding streams, in ~10 paced steps; (2.93 s - 10 x (a + 8c)) / 1,500 = 1.79 ms.
  Check against W2 (48 requests, 16 at a time, prompts 64-512, outputs 32-256), replayed through one
  replica here with three seeds: 40.8-46.9 s, 144-168 output tok/s, TTFT p50 0.76-0.95 s; the Zen 4
  served 43.1 / 48.5 s, 131.5 / 128.1 tok/s, TTFT p50 0.87 / 1.05 s. Not modelled: attention's cost
  growing with the context (it makes long cached contexts look a little cheaper than they are), the
  served path's per-step overhead, host noise.
`--step-model a,b,c` (milliseconds) sets other constants.

The router. Round-robin; least queue (the endpoint picker's queue scorer: fewest waiting + running);
prefix affinity: per replica, the set of block hashes that replica announced stored and not yet removed,
built from its KV events alone (BlockStored, BlockRemoved, AllBlocksCleared), drained after every step as
the engine publishes them. A request's score on a replica is llm-d's precise prefix-cache scorer (leading
prompt blocks cached there / prompt blocks) weighted 3, plus its queue scorer (min-max normalised queue
length, the shortest 1) weighted 2, as llm-d's precise-prefix-cache guide configures them; highest score
wins, ties at random. Against hot spots, only replicas whose queue is within `--affinity-slack` of the
least-loaded one are candidates (a filter before the scorers). "prefix, unguarded" drops that filter, to
show the risk: a prefix score near 1 outweighs any queue difference (the queue score is normalised to
[0, 1] whatever the queues' spread), so a replica that holds a long prefix gets its requests however long
its queue grows.

The traces. `chat`: multi-turn conversations, each opened with one of a few shared system prompts; each
turn's prompt is the whole conversation so far (system prompt, earlier user messages and answers) plus a
new user message; token ids are random ints from the seeded RNG, answers too (the simulated engine
"generates" the answer the trace holds, EOS ignored). `random`: single-turn prompts sharing nothing, where
prefix affinity can buy nothing. Traffic is open-loop: every arrival time is fixed in the trace, so a
trace replays identically under every policy and can be recorded and replayed. A conversation's next turn
arrives after its previous turn's arrival plus an allowance for the answer (0.15 s per output token, a
loaded replica's step) plus think time (5 s + exponential, mean 15 s). Under heavy load a turn can arrive
before its previous answer finished (impossible in real chat, harmless here: it finds less cached); the
report counts such turns. `--rate` is mean requests per second per replica, so the pool's rate scales
with `--replicas` and the load per replica stays put. Traces grow with the pool (50 conversations or
250 single-turn requests per replica) so that the load reaches a steady state; the first conversations of
a larger pool's trace are the smaller pool's (same seed), only their start times scale.

Trace files are JSONL, one request a line, in arrival order: {"arrival_s", "conversation", "turn",
"prompt_tokens", "max_new_tokens", "output_tokens"}; with "extends_turn": k, the prompt is turn k's prompt
and output followed by "prompt_tokens" (the compact form `--record` writes for chat turns). Without
"output_tokens" the answer is drawn from an RNG seeded by (conversation, turn).

The report, per policy: TTFT p50 / p99 and end-to-end p50 (arrival to the step that produced the token),
prefix hit rate (prompt tokens found cached at admission / prompt tokens), output tokens/s (over the first
arrival to the last completion; open-loop traffic at a load the pool sustains makes it the offered load,
alike for every policy), and the replicas' busy fraction, mean and max, over the middle half of the
arrivals (the steady state: it is the compute a policy saves, and the max shows hot spots). Under each
table: requests per replica, turns that arrived early, blocks evicted, whether every request completed
once, whether the router's event-built view equals each replica's cache at the end, and how many
requests the hot-spot filter diverted from the replica with the longest cached prefix. Above it, the hit
rate's ceiling: one replica with an unbounded cache.

Deterministic for a seed: the trace's RNG, and the routers' tie-breaking RNG, derive from `--seed`.
A simulation, not a measurement: its numbers are as good as the step model.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import random
import sys
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tgi_llm.bench.stats import percentile  # noqa: E402
from tgi_llm.engine.block_hash import hash_blocks  # noqa: E402
from tgi_llm.engine.kv_cache_manager import KVCacheManager  # noqa: E402
from tgi_llm.engine.kv_events import (  # noqa: E402
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEvent,
    KVEventLog,
    external_hash,
)
from tgi_llm.engine.pacing import StepBudget  # noqa: E402

BLOCK_SIZE = 16
VOCAB = 49152  # SmolLM2's
KV_BLOCKS = 1024  # the CPU default: 16,384 tokens
STEP_TOKENS = 512  # CPU_STEP_TOKENS: max_batch_prefill_tokens on the CPU
STEP_TARGET_MS = 300.0  # CPU_STEP_TARGET_MS: --prefill-step-target-ms on the CPU
SCENARIOS = ("chat", "random")
#: Requests/s per replica that keep least-queue's replicas ~70% busy in the steady state (found with this tool).
DEFAULT_RATE = {"chat": 0.45, "random": 0.38}
#: Trace sizes scale with the pool, so that the load reaches its steady state whatever the pool's size (a
#: conversation lasts ~150 s; at the default rate 50 conversations a replica start over ~550 s).
CONVERSATIONS_PER_REPLICA = 50
REQUESTS_PER_REPLICA = 250
POLICIES = ("round-robin", "least-queue", "prefix-affinity", "prefix, unguarded")


# ---- the time model ----

@dataclass(frozen=True)
class StepModel:
    """Seconds a step takes: a + b * prompt tokens computed + c * decoding sequences."""

    a: float = 0.0040
    b: float = 0.0018
    c: float = 0.0024

    def seconds(self, prompt_tokens: int, decodes: int) -> float:
        return self.a + self.b * prompt_tokens + self.c * decodes

    @classmethod
    def parse(cls, text: str) -> StepModel:
        a, b, c = (float(x) / 1000 for x in text.split(","))
        return cls(a, b, c)


@dataclass(frozen=True)
class ReplicaConfig:
    kv_blocks: int = KV_BLOCKS
    step_tokens: int = STEP_TOKENS
    step_target_s: float | None = STEP_TARGET_MS / 1000
    model: StepModel = field(default_factory=StepModel)


# ---- traces ----

@dataclass
class TraceRequest:
    arrival_s: float
    conversation: int
    turn: int
    prompt: list[int]
    output: list[int]
    #: For chat turns: the earlier turn whose prompt + output open this prompt (the compact record form).
    extends_turn: int | None = None
    #: Where this prompt's own tokens start (after the extended turn's prompt + output).
    new_from: int = 0


@dataclass(frozen=True)
class ChatShape:
    """A multi-turn chat trace's distributions (lengths in tokens)."""

    conversations: int = 200
    system_prompts: int = 4
    system_tokens: tuple[int, int] = (300, 600)
    turns: tuple[int, int] = (2, 8)
    user_tokens: tuple[int, int, int] = (60, 8, 400)  # median, min, max (log-normal)
    output_tokens: tuple[int, int, int] = (120, 16, 512)
    think_min_s: float = 5.0
    think_mean_s: float = 15.0  # exponential, on top of the minimum
    answer_s_per_token: float = 0.15  # the allowance for the previous answer before the think time starts


@dataclass(frozen=True)
class RandomShape:
    """A single-turn trace of unrelated prompts."""

    requests: int = 1000
    prompt_tokens: tuple[int, int, int] = (400, 32, 2048)
    output_tokens: tuple[int, int, int] = (120, 16, 512)


def _tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(VOCAB) for _ in range(n)]


def _length(rng: random.Random, spec: tuple[int, int, int], sigma: float = 0.6) -> int:
    median, lo, hi = spec
    return int(min(max(rng.lognormvariate(math.log(median), sigma), lo), hi))


def chat_trace(seed: int, pool_rate: float, shape: ChatShape = ChatShape()) -> list[TraceRequest]:
    """Conversations start as a Poisson process at pool_rate / mean turns; each turn extends the last."""
    rng = random.Random(seed)
    systems = [_tokens(rng, rng.randint(*shape.system_tokens)) for _ in range(shape.system_prompts)]
    conversation_rate = pool_rate / (sum(shape.turns) / 2)
    out: list[TraceRequest] = []
    start = 0.0
    for conv in range(shape.conversations):
        start += rng.expovariate(conversation_rate)
        history, arrival = list(systems[rng.randrange(len(systems))]), start
        for turn in range(rng.randint(*shape.turns)):
            prompt = history + _tokens(rng, _length(rng, shape.user_tokens))
            answer = _tokens(rng, _length(rng, shape.output_tokens))
            new_from = len(history) if turn else 0
            out.append(TraceRequest(arrival, conv, turn, prompt, answer, turn - 1 if turn else None, new_from))
            history = prompt + answer
            think = shape.think_min_s + rng.expovariate(1 / shape.think_mean_s)
            arrival += shape.answer_s_per_token * len(answer) + think
    return sorted(out, key=lambda r: (r.arrival_s, r.conversation, r.turn))


def random_trace(seed: int, pool_rate: float, shape: RandomShape = RandomShape()) -> list[TraceRequest]:
    """Poisson arrivals of unrelated single-turn prompts: nothing to share."""
    rng = random.Random(seed)
    out, t = [], 0.0
    for i in range(shape.requests):
        t += rng.expovariate(pool_rate)
        out.append(TraceRequest(t, i, 0, _tokens(rng, _length(rng, shape.prompt_tokens)),
                                _tokens(rng, _length(rng, shape.output_tokens))))
    return out


def write_trace(path: Path, trace: Iterable[TraceRequest]) -> None:
    with path.open("w") as f:
        for r in trace:
            line = {"arrival_s": round(r.arrival_s, 6), "conversation": r.conversation, "turn": r.turn,
                    "prompt_tokens": r.prompt[r.new_from:], "max_new_tokens": len(r.output),
                    "output_tokens": r.output}
            if r.extends_turn is not None:
                line["extends_turn"] = r.extends_turn
            f.write(json.dumps(line, separators=(",", ":")) + "\n")


def read_trace(path: Path) -> list[TraceRequest]:
    """A JSONL trace (module docstring); an `extends_turn` must come after the turn it extends."""
    done: dict[tuple[int, int], TraceRequest] = {}
    out: list[TraceRequest] = []
    for n, text in enumerate(path.read_text().splitlines(), 1):
        if not text.strip():
            continue
        rec = json.loads(text)
        conv, turn, new = int(rec["conversation"]), int(rec["turn"]), list(rec["prompt_tokens"])
        prefix: list[int] = []
        if (ext := rec.get("extends_turn")) is not None:
            if (conv, ext) not in done:
                raise ValueError(f"{path}:{n}: turn {turn} extends turn {ext}, not seen before it")
            base = done[(conv, ext)]
            prefix = base.prompt + base.output
        output = rec.get("output_tokens")
        if output is None:
            output = _tokens(random.Random(f"{conv}:{turn}"), int(rec["max_new_tokens"]))
        req = TraceRequest(float(rec["arrival_s"]), conv, turn, prefix + new, list(output), ext, len(prefix))
        done[(conv, turn)] = req
        out.append(req)
    return sorted(out, key=lambda r: (r.arrival_s, r.conversation, r.turn))


# ---- a replica ----

@dataclass
class SimSequence:
    """What KVCacheManager reads of a sequence (CacheableSequence), plus the simulation's bookkeeping."""

    request_id: int
    token_ids: list[int]
    input_length: int
    output: list[int]
    arrival_s: float
    num_computed: int = 0
    generated: int = 0
    cached_tokens: int = 0
    first_token_s: float | None = None
    done_s: float | None = None
    replica: int = -1
    cache_lookup: bool = True
    cache_key: bytes = b""
    lora_name: str | None = None

    @property
    def prefilling(self) -> bool:
        return self.num_computed < self.input_length


@dataclass
class Replica:
    """A continuous batcher over a real KVCacheManager that records its KV events."""

    index: int
    config: ReplicaConfig
    kv: KVCacheManager = field(init=False)
    waiting: list[SimSequence] = field(default_factory=list)
    running: list[SimSequence] = field(default_factory=list)
    stepping: bool = False
    #: (start, seconds) of every step.
    steps: list[tuple[float, float]] = field(default_factory=list)
    admitted: int = 0

    def __post_init__(self) -> None:
        self.kv = KVCacheManager(self.config.kv_blocks, BLOCK_SIZE)
        # The manager's event hook (--kv-events-endpoint): every registration and every forgotten key.
        self.kv.events = KVEventLog(BLOCK_SIZE)

    @property
    def queue_length(self) -> int:
        return len(self.waiting) + len(self.running)

    def cached_hashes(self) -> set[int]:
        """What the prefix cache really holds (read from the manager's internals, to check the events)."""
        return {external_hash(key) for key in self.kv._block_of}

    def _budget(self, decodes: int) -> StepBudget:
        """The step's prompt-token budget, as StepPacer.step_budget gives it with the model's exact costs."""
        cfg, model = self.config, self.config.model
        floor = min(BLOCK_SIZE, cfg.step_tokens)
        cap = max(cfg.step_tokens - decodes, floor)
        if not decodes or cfg.step_target_s is None:
            return StepBudget(cap, floor=floor)
        room = max(cfg.step_target_s - model.seconds(0, decodes), 0.0)
        return StepBudget(cap, room / model.b, 0.0, floor)

    def plan(self, now: float) -> list[tuple[SimSequence, int]]:
        """The next step's (sequence, tokens) entries, admitting waiting requests whose blocks fit."""
        decodes = [s for s in self.running if not s.prefilling]
        entries = [(s, 1) for s in decodes]
        budget = self._budget(len(decodes))
        for seq in (s for s in self.running if s.prefilling):
            if budget.exhausted:
                break
            if n := budget.take(seq.num_computed, seq.input_length - seq.num_computed):
                entries.append((seq, n))
        b = self.config.model.b
        for seq in sorted(self.waiting, key=lambda s: s.input_length * b - (now - s.arrival_s)):
            if budget.exhausted:
                break
            cached = self.kv.allocate(seq, seq.input_length + len(seq.output) - 1)
            if cached is None:
                break  # too few free blocks: it waits, and so does everything behind it
            self.waiting.remove(seq)
            self.running.append(seq)
            seq.num_computed = seq.cached_tokens = cached
            self.admitted += 1
            if n := budget.take(seq.num_computed, seq.input_length - seq.num_computed):
                entries.append((seq, n))
        return entries

    def step_seconds(self, entries: list[tuple[SimSequence, int]]) -> float:
        prompt = sum(n for s, n in entries if s.prefilling)
        return self.config.model.seconds(prompt, len(entries) - sum(1 for s, _ in entries if s.prefilling))

    def finish(self, entries: list[tuple[SimSequence, int]], now: float) -> list[SimSequence]:
        """Advance every sequence of the step that ends at `now`; register full blocks; free the finished."""
        finished = []
        for seq, n in entries:
            seq.num_computed += n
            if seq.num_computed >= seq.input_length:  # a prompt's last chunk or a decode: one token out
                seq.token_ids.append(seq.output[seq.generated])
                seq.generated += 1
                if seq.first_token_s is None:
                    seq.first_token_s = now
                if seq.generated == len(seq.output):
                    seq.done_s = now
                    finished.append(seq)
            self.kv.cache_computed(seq)
        for seq in finished:
            self.kv.free(seq)
            self.running.remove(seq)
        return finished

    def drain_events(self) -> list[KVEvent]:
        return self.kv.events.drain()


# ---- the router ----

@dataclass
class RouterView:
    """Per replica, the block hashes it announced stored and not yet removed: all a KV-event subscriber knows."""

    blocks: list[set[int]]
    removed: int = 0

    def apply(self, replica: int, events: Iterable[KVEvent]) -> None:
        held = self.blocks[replica]
        for event in events:
            if isinstance(event, BlockStored):
                held.update(event.block_hashes)
            elif isinstance(event, BlockRemoved):
                held.difference_update(event.block_hashes)
                self.removed += len(event.block_hashes)
            elif isinstance(event, AllBlocksCleared):
                held.clear()

    def leading(self, replica: int, hashes: list[int]) -> int:
        """How many of the prompt's leading blocks the replica has cached."""
        held, n = self.blocks[replica], 0
        for h in hashes:
            if h not in held:
                break
            n += 1
        return n


class Policy(Protocol):
    name: str

    def __call__(self, hashes: list[int], queues: list[int], view: RouterView) -> int: ...


def _pick(rng: random.Random, scores: dict[int, float]) -> int:
    """The highest score; ties at random (the endpoint picker's max-score picker)."""
    best = max(scores.values())
    return rng.choice([r for r, s in scores.items() if s >= best - 1e-12])


@dataclass
class RoundRobin:
    name: str = "round-robin"
    turn: int = 0

    def __call__(self, hashes: list[int], queues: list[int], view: RouterView) -> int:
        self.turn += 1
        return (self.turn - 1) % len(queues)


@dataclass
class LeastQueue:
    """The endpoint picker's queue scorer alone: fewest waiting + running."""

    rng: random.Random
    name: str = "least-queue"

    def __call__(self, hashes: list[int], queues: list[int], view: RouterView) -> int:
        return _pick(self.rng, {r: -q for r, q in enumerate(queues)})


@dataclass
class PrefixAffinity:
    """llm-d's precise prefix-cache scorer (weight 3) + queue scorer (weight 2), max score wins. With `slack`,
    a filter first keeps only replicas whose queue is within `slack` of the shortest (against hot spots)."""

    rng: random.Random
    slack: int | None
    name: str = "prefix-affinity"
    prefix_weight: float = 3.0
    queue_weight: float = 2.0
    #: Requests the filter sent away from the replica that cached the longest prefix of their prompt.
    diverted: int = 0

    def __call__(self, hashes: list[int], queues: list[int], view: RouterView) -> int:
        lo = min(queues)
        matched = [view.leading(r, hashes) for r in range(len(queues))]
        candidates = [r for r, q in enumerate(queues) if self.slack is None or q <= lo + self.slack]
        hi = max(queues[r] for r in candidates)
        scores = {}
        for r in candidates:
            prefix = matched[r] / len(hashes) if hashes else 0.0
            queue = (hi - queues[r]) / (hi - lo) if hi > lo else 1.0
            scores[r] = self.prefix_weight * prefix + self.queue_weight * queue
        if max(matched[r] for r in candidates) < max(matched):
            self.diverted += 1
        return _pick(self.rng, scores)


def make_policy(name: str, seed: int, slack: int) -> Policy:
    rng = random.Random(f"router:{seed}")
    if name == "round-robin":
        return RoundRobin()
    if name == "least-queue":
        return LeastQueue(rng)
    if name == "prefix-affinity":
        return PrefixAffinity(rng, slack)
    if name == "prefix, unguarded":
        return PrefixAffinity(rng, None, name)
    raise ValueError(f"unknown policy {name!r}")


# ---- the simulation ----

@dataclass
class RunResult:
    policy: Policy
    replicas: int
    sequences: list[SimSequence]
    trace: list[TraceRequest]
    steps: list[list[tuple[float, float]]]
    requests_per_replica: list[int]
    completions: list[int]
    router_view: list[set[int]]
    cached: list[set[int]]
    removed_blocks: int

    @property
    def makespan_s(self) -> float:
        return max(s.done_s for s in self.sequences) - min(s.arrival_s for s in self.sequences)

    @property
    def hit_rate(self) -> float:
        return sum(s.cached_tokens for s in self.sequences) / sum(s.input_length for s in self.sequences)

    @property
    def throughput(self) -> float:
        return sum(len(s.output) for s in self.sequences) / self.makespan_s

    @property
    def busy(self) -> list[float]:
        """Each replica's busy fraction over the middle half of the arrivals (the steady state: the trace's
        first and last conversations ramp the load up and down)."""
        arrivals = sorted(r.arrival_s for r in self.trace)
        t0, t1 = arrivals[len(arrivals) // 4], arrivals[3 * len(arrivals) // 4]
        return [sum(max(0.0, min(t + d, t1) - max(t, t0)) for t, d in steps) / (t1 - t0) for steps in self.steps]

    @property
    def early_turns(self) -> int:
        """Chat turns that arrived before their previous turn's answer was complete."""
        done = {(r.conversation, r.turn): s.done_s for r, s in zip(self.trace, self.sequences, strict=True)}
        return sum(1 for r in self.trace if r.turn and r.arrival_s < done.get((r.conversation, r.turn - 1), 0.0))

    @property
    def view_matches(self) -> bool:
        return self.router_view == self.cached


def _prompt_hashes(prompt: list[int]) -> list[int]:
    return [external_hash(k) for k in hash_blocks(prompt, BLOCK_SIZE, len(prompt) // BLOCK_SIZE)]


def simulate(trace: list[TraceRequest], policy_name: str, replicas: int, config: ReplicaConfig = ReplicaConfig(),
             seed: int = 0, slack: int = 4) -> RunResult:
    """Discrete events: arrivals (routed at once) and step ends (each replica steps while it has work)."""
    pool = [Replica(i, config) for i in range(replicas)]
    view = RouterView([set() for _ in pool])
    policy = make_policy(policy_name, seed, slack)
    seqs = [SimSequence(i, list(r.prompt), len(r.prompt), r.output, r.arrival_s) for i, r in enumerate(trace)]
    capacity = config.kv_blocks * BLOCK_SIZE
    for s in seqs:
        if s.input_length + len(s.output) - 1 > capacity:
            raise ValueError(f"request {s.request_id} needs {s.input_length + len(s.output) - 1} KV slots; "
                             f"a replica has {capacity}")
    events: list[tuple[float, int, int, int]] = [(s.arrival_s, 1, s.request_id, -1) for s in seqs]
    heapq.heapify(events)  # (time, 0 = step end before 1 = arrival, request id or step number, replica)
    plans: dict[int, list[tuple[SimSequence, int]]] = {}
    completions: list[int] = []

    def start_step(rep: Replica, now: float) -> None:
        entries = rep.plan(now)
        rep.stepping = bool(entries)
        if entries:
            seconds = rep.step_seconds(entries)
            rep.steps.append((now, seconds))
            plans[rep.index] = entries
            heapq.heappush(events, (now + seconds, 0, 0, rep.index))

    while events:
        now, kind, rid, r = heapq.heappop(events)
        if kind == 1:
            seq = seqs[rid]
            seq.replica = policy(_prompt_hashes(seq.token_ids), [p.queue_length for p in pool], view)
            rep = pool[seq.replica]
            rep.waiting.append(seq)
            if not rep.stepping:
                start_step(rep, now)
            continue
        rep = pool[r]
        completions.extend(s.request_id for s in rep.finish(plans.pop(r), now))
        view.apply(r, rep.drain_events())
        start_step(rep, now)
    return RunResult(policy, replicas, seqs, trace, [p.steps for p in pool], [p.admitted for p in pool],
                     completions, view.blocks, [p.cached_hashes() for p in pool], view.removed)


# ---- the report ----

def ceiling_hit_rate(trace: list[TraceRequest]) -> float:
    """The hit rate of one replica with an unbounded cache: a prompt finds every block an earlier request
    computed (its prompt and output but the last token), less its own last block. What routing can approach."""
    seen: set[bytes] = set()
    hit = total = 0
    for r in sorted(trace, key=lambda r: r.arrival_s):
        for key in hash_blocks(r.prompt, BLOCK_SIZE, (len(r.prompt) - 1) // BLOCK_SIZE):
            if key not in seen:
                break
            hit += BLOCK_SIZE
        total += len(r.prompt)
        computed = r.prompt + r.output[:-1]
        seen.update(hash_blocks(computed, BLOCK_SIZE, len(computed) // BLOCK_SIZE))
    return hit / total


def table(results: list[RunResult]) -> str:
    rows = ["| policy | TTFT p50 s | TTFT p99 s | E2E p50 s | prefix hit | output tok/s | busy mean / max |",
            "| --- | --- | --- | --- | --- | --- | --- |"]
    for res in results:
        ttft = [s.first_token_s - s.arrival_s for s in res.sequences]
        e2e = [s.done_s - s.arrival_s for s in res.sequences]
        busy = res.busy
        rows.append(f"| {res.policy.name} | {percentile(ttft, 50):.2f} | {percentile(ttft, 99):.2f} | "
                    f"{percentile(e2e, 50):.1f} | {res.hit_rate:.1%} | {res.throughput:.0f} | "
                    f"{sum(busy) / len(busy):.0%} / {max(busy):.0%} |")
    return "\n".join(rows)


def notes(results: list[RunResult]) -> str:
    lines = []
    for res in results:
        counts = Counter(res.completions)
        complete = len(counts) == len(res.sequences) and set(counts.values()) == {1}
        diverted = f"; {res.policy.diverted} diverted by the queue filter" if hasattr(res.policy, "diverted") else ""
        lines.append(f"- {res.policy.name}: requests per replica {res.requests_per_replica}; "
                     f"{res.early_turns} turns arrived before their previous answer ended; "
                     f"{res.removed_blocks} blocks evicted; every request completed once: {complete}; "
                     f"router's event-built view = each replica's cache: {res.view_matches}{diverted}")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", nargs="+", choices=SCENARIOS, default=list(SCENARIOS))
    ap.add_argument("--replicas", nargs="+", type=int, default=[4])
    ap.add_argument("--rate", type=float, default=None,
                    help=f"mean requests/s per replica (default per scenario: {DEFAULT_RATE})")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--conversations", type=int, default=None,
                    help=f"the chat scenario's conversations (default {CONVERSATIONS_PER_REPLICA} per replica)")
    ap.add_argument("--requests", type=int, default=None,
                    help=f"the random scenario's requests (default {REQUESTS_PER_REPLICA} per replica)")
    ap.add_argument("--kv-blocks", type=int, default=KV_BLOCKS, help="KV blocks per replica (16 tokens each)")
    ap.add_argument("--step-model", type=StepModel.parse, default=StepModel(), metavar="A,B,C",
                    help="step time = A + B x prompt tokens + C x decodes, in ms (default 4.0,1.8,2.4)")
    ap.add_argument("--step-tokens", type=int, default=STEP_TOKENS)
    ap.add_argument("--step-target-ms", type=float, default=STEP_TARGET_MS, help="0: no pacing")
    ap.add_argument("--affinity-slack", type=int, default=4,
                    help="prefix affinity considers replicas whose queue is within this of the shortest")
    ap.add_argument("--policies", nargs="+", choices=POLICIES, default=list(POLICIES))
    ap.add_argument("--trace", type=Path, help="replay this JSONL trace instead of generating one")
    ap.add_argument("--record", type=Path, help="write the generated trace here (one scenario, one replica count)")
    args = ap.parse_args(argv)
    if args.record and (args.trace or len(args.scenario) > 1 or len(args.replicas) > 1):
        ap.error("--record writes one generated trace: give one --scenario and one --replicas, no --trace")
    return args


def make_trace(scenario: str, replicas: int, args: argparse.Namespace) -> tuple[list[TraceRequest], str]:
    """The trace for one table, and how it was made."""
    if args.trace:
        trace = read_trace(args.trace)
        return trace, f"{len(trace)} requests replayed from {args.trace}"
    rate = args.rate or DEFAULT_RATE[scenario]
    if scenario == "chat":
        shape = ChatShape(conversations=args.conversations or CONVERSATIONS_PER_REPLICA * replicas)
        trace = chat_trace(args.seed, rate * replicas, shape)
        what = f"{shape.conversations} conversations"
    else:
        trace = random_trace(args.seed, rate * replicas, RandomShape(args.requests or REQUESTS_PER_REPLICA * replicas))
        what = "single-turn, nothing shared"
    return trace, f"{len(trace)} requests, {what}, {rate:g} requests/s per replica"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    config = ReplicaConfig(args.kv_blocks, args.step_tokens, args.step_target_ms / 1000 or None, args.step_model)
    m = config.model
    print(f"step model: {m.a * 1e3:g} ms + {m.b * 1e3:g} ms x prompt tokens + {m.c * 1e3:g} ms x decodes; "
          f"{config.kv_blocks} KV blocks of {BLOCK_SIZE} per replica; affinity slack {args.affinity_slack}; "
          f"seed {args.seed}\n")
    started = time.perf_counter()
    for scenario in ([args.trace.name] if args.trace else args.scenario):
        for n in args.replicas:
            trace, what = make_trace(scenario, n, args)
            if args.record:
                write_trace(args.record, trace)
            results = [simulate(trace, p, n, config, args.seed, args.affinity_slack) for p in args.policies]
            what += f"; hit-rate ceiling {ceiling_hit_rate(trace):.1%}"
            print(f"### {scenario}, {n} replicas ({what})\n\n{table(results)}\n\n{notes(results)}\n")
    print(f"simulated in {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
