"""Shared fixtures: tiny random models, the real default model, and a paged-batch builder."""

from __future__ import annotations

import contextlib
import json
import random
import shutil
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # plain `pytest` (not `python -m pytest`) does not add the repo root
    sys.path.insert(0, str(ROOT))

from tgi_llm.attention.cpu_kernels import cpu_attention_kernels  # noqa: E402
from tgi_llm.attention.metadata import AttentionMetadata  # noqa: E402
from tgi_llm.engine.kv_cache_manager import KVCacheManager  # noqa: E402
from tgi_llm.engine.limits import LimitOptions, resolve_limits  # noqa: E402
from tgi_llm.engine.runner_protocol import SampledToken, SeqResult  # noqa: E402
from tgi_llm.engine.scheduler import Scheduler  # noqa: E402
from tgi_llm.engine.sequence import Sequence  # noqa: E402
from tgi_llm.engine.step_plan import StepPlan  # noqa: E402
from tgi_llm.engine.stopping import StopChecker  # noqa: E402
from tgi_llm.request import SamplingParams, StoppingParams, ValidRequest  # noqa: E402

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


@pytest.fixture
def use_settings() -> Iterator[Callable[..., None]]:
    """`use_settings(**changes)`: the rest of the test runs with those runtime settings (tgi_llm/settings.py)."""
    from tgi_llm.settings import override

    with contextlib.ExitStack() as stack:
        yield lambda **changes: stack.enter_context(override(**changes))


@pytest.fixture(scope="session")
def stack(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """One real launched server with all three fronts (gateway HTTP/gRPC, TGI/OpenAI front) for every test
    that needs them (tests/front, tests/fuzz): loading costs ~20-40 s."""
    from tests.front.stack import launch_stack

    yield from launch_stack(default_model_dir, tmp_path_factory)


@pytest.fixture(scope="session")
def default_model_dir() -> Path:
    """The real default model (SmolLM2-135M-Instruct), converted from its GGUF once and then reused
    from the cache ($TGI_LLM_CACHE, else ~/.cache/tgi_llm)."""
    from tgi_llm.weights import resolve_model_dir

    return resolve_model_dir(None)


def _write_tiny_model(path: Path, model_type: str, seed: int, **overrides) -> Path:
    import transformers

    base = dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=256,
        max_position_embeddings=512,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        initializer_range=0.1,  # larger than default so attention patterns are far from uniform
        bos_token_id=1,
        eos_token_id=2,
    )
    base.update(overrides)
    torch.manual_seed(seed)
    config = transformers.AutoConfig.for_model(model_type, **base)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():  # random norm weights and biases, so a missed one shows in the logits
        for name, param in model.named_parameters():
            if "norm" in name:
                param.uniform_(0.5, 1.5)
            elif name.endswith("bias"):
                param.normal_(0, 0.1)
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_model_factory(tmp_path_factory) -> Callable[..., Path]:
    """`factory(model_type="llama", seed=0, **config_overrides) -> dir`: a random tiny HF model of any
    transformers model_type (hidden 64, 4 heads, 2 KV heads, 2 layers, vocab 256, untied), built once per
    argument set."""
    built: dict[str, Path] = {}

    def factory(model_type: str = "llama", seed: int = 0, **overrides) -> Path:
        key = json.dumps([model_type, seed, overrides], sort_keys=True)
        if key not in built:
            path = tmp_path_factory.mktemp(f"tiny-{model_type}")
            built[key] = _write_tiny_model(path, model_type, seed, **overrides)
        return built[key]

    return factory


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory, default_model_dir: Path) -> Path:
    """Random tiny Llama (GQA 4/2 heads, 2 layers, untied embeddings) with the default model's
    tokenizer (vocab 49152) and generation_config, for end-to-end tests that need text."""
    path = tmp_path_factory.mktemp("tiny-llama-tok")
    vocab = json.loads((default_model_dir / "config.json").read_text())["vocab_size"]
    _write_tiny_model(path, "llama", seed=0, vocab_size=vocab)
    for name in (*TOKENIZER_FILES, "generation_config.json"):
        if (default_model_dir / name).is_file():
            shutil.copy(default_model_dir / name, path / name)
    return path


@dataclass
class PagedBatcher:
    """Test stand-in for the scheduler + block allocator: hands out blocks in shuffled order (so
    block tables are not contiguous) and builds the flat batch for one step."""

    block_size: int
    num_blocks: int
    seed: int = 0
    tables: dict[int, list[int]] = field(default_factory=dict)
    lengths: dict[int, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.free = list(range(self.num_blocks))
        random.Random(self.seed).shuffle(self.free)

    def step(self, chunks: list[tuple[int, list[int]]]) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        """`chunks`: (sequence id, new token ids) per sequence -> input_ids, positions, metadata."""
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        q_lens: list[int] = []
        seq_lens: list[int] = []
        for seq_id, tokens in chunks:
            start = self.lengths.get(seq_id, 0)
            end = start + len(tokens)
            table = self.tables.setdefault(seq_id, [])
            while len(table) * self.block_size < end:
                table.append(self.free.pop())
            ids.extend(tokens)
            positions.extend(range(start, end))
            slots.extend(table[p // self.block_size] * self.block_size + p % self.block_size for p in range(start, end))
            q_lens.append(len(tokens))
            seq_lens.append(end)
            self.lengths[seq_id] = end
        width = max(len(self.tables[s]) for s, _ in chunks)
        block_tables = torch.zeros((len(chunks), width), dtype=torch.int32)
        for row, (seq_id, _) in enumerate(chunks):
            block_tables[row, : len(self.tables[seq_id])] = torch.tensor(self.tables[seq_id])
        qsl = [0]
        for n in q_lens:
            qsl.append(qsl[-1] + n)
        attn = AttentionMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.int64),
            query_start_loc=torch.tensor(qsl, dtype=torch.int32),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
            block_tables=block_tables,
            query_lens_cpu=q_lens,
            seq_lens_cpu=seq_lens,
            block_size=self.block_size,
        )
        return torch.tensor(ids), torch.tensor(positions), attn


@pytest.fixture
def paged_batcher() -> Callable[..., PagedBatcher]:
    """`paged_batcher(block_size=4, num_blocks=64, seed=0) -> PagedBatcher`."""

    def make(block_size: int = 4, num_blocks: int = 64, seed: int = 0) -> PagedBatcher:
        return PagedBatcher(block_size, num_blocks, seed)

    return make


class _SilentDetokenizer:
    def step(self, token_id: int) -> str:
        return ""

    def finish(self) -> str:
        return ""


class PlanPlayer:
    """The engine's scheduler and KV manager without a model: `plan()` gives the StepPlan the engine would
    run next, `advance(plan)` plays the sampler (request r's next token is `next_token(r)`), ends the
    sequences that finished and frees their blocks, as the engine does. Tests get real plans (chunks,
    prefix-cache hits, released ids) without deriving them a second way."""

    def __init__(self, block_size: int = 16, num_blocks: int = 64, step_tokens: int = 4096,
                 prefix_caching: bool = True, next_token=lambda r: 1000 + r) -> None:
        total = num_blocks * block_size
        limits = resolve_limits(LimitOptions(max_input_tokens=total - 1, max_total_tokens=total,
                                             max_batch_prefill_tokens=min(step_tokens, total), block_size=block_size,
                                             max_batch_total_tokens=total, prefix_caching=prefix_caching), None, None)
        self.kv = KVCacheManager(num_blocks, block_size, prefix_caching)
        self.scheduler = Scheduler(limits, self.kv)
        self.next_token = next_token
        self._ids = iter(range(1, 10**9))

    def add(self, prompt: list[int], max_new_tokens: int = 4, **request_kw) -> Sequence:
        stopping = StoppingParams(max_new_tokens)
        request = ValidRequest(tuple(prompt), SamplingParams(), stopping, **request_kw)
        seq = Sequence(next(self._ids), request, lambda _e: None, _SilentDetokenizer(), StopChecker(set(), stopping))
        self.scheduler.add(seq)
        return seq

    def plan(self) -> StepPlan:
        return self.scheduler.schedule()

    def advance(self, plan: StepPlan) -> None:
        results = [SeqResult([SampledToken(self.next_token(e.request_id))]) if e.samples else None
                   for e in plan.seqs]
        for seq, _ in self.scheduler.update(plan, results):
            if seq.finish_reason is not None:
                self.scheduler.finish(seq)


@pytest.fixture
def plan_player() -> Callable[..., PlanPlayer]:
    """`plan_player(block_size=16, num_blocks=64, step_tokens=4096, prefix_caching=True) -> PlanPlayer`."""
    return PlanPlayer


@pytest.fixture
def c_kernels() -> None:
    """The C kernels must be there: a kernel test fails, never skips, where they can't be built or loaded, so that
    a CI without a C compiler cannot go green with the C untested."""
    from tgi_llm.native import library

    try:
        library()
    except Exception as exc:
        pytest.fail(f"the C kernels are unavailable (a C compiler is required to test them): {exc}")


@pytest.fixture
def prefill_kernel_chosen(monkeypatch) -> None:
    """Prompt chunks through the C prefill attention kernel, whatever its load-time race against SDPA chose (it
    loses in a build without AVX): mixed steps then take the fused layer stack on every machine."""
    kernels = cpu_attention_kernels()
    if kernels is not None:
        monkeypatch.setattr(kernels, "prefill_wins", True)
