"""Replay served steps through the step pacer: how well it predicts the steps that carry prompt tokens while
streams decode (what decides whether they keep `--prefill-step-target-ms`).

    LOG_LEVEL=debug tgi-llm-launcher > server.log 2>&1   # then drive it (the peers' harness, tgi-llm-bench)
    python tools/pacer_replay.py server.log [--config MODEL_DIR/config.json]

Each engine step's debug line ("step: N tokens, D decodes, S s, chunks [(context, tokens), ...]") is fed
to a fresh `StepPacer` in order. Before each step with decodes and at least MIN_SAMPLE_TOKENS prompt tokens,
the pacer's prediction (decode base + cost per work unit x the step's work) is compared with what the step
took. The chunks are the ones the served pacer chose, so this judges prediction, not the sizes another
pacer would have chosen. LOG_LEVEL=debug also makes tritonserver log every request verbosely, which slows
the served steps (a W2 + W4 trace: 31 MB of log, steps ~1.5-2x their cost at info level): compare
estimators on one trace, not a trace with a normal run. No assertion: a benchmark.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tgi_llm.engine.pacing import MIN_SAMPLE_TOKENS, StepPacer, chunk_work  # noqa: E402

SMOLLM2_SHAPE = {"model_type": "llama", "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
                 "num_attention_heads": 9, "num_key_value_heads": 3, "vocab_size": 49152}
STEP_LINE = re.compile(r"step: (\d+) tokens, (\d+) decodes, ([\d.]+) s, chunks (\[[^\]]*\])")


def read_steps(path: Path) -> list[tuple[int, int, float, list[tuple[int, int]]]]:
    steps = []
    for line in path.read_text(errors="replace").splitlines():
        if m := STEP_LINE.search(line):
            steps.append((int(m[1]), int(m[2]), float(m[3]), ast.literal_eval(m[4])))
    return steps


def prediction_errors_ms(steps, target_s: float, context_weight: float) -> list[float]:
    """Predicted minus measured time (ms) of each paced step that carried enough prompt tokens to judge."""
    pacer = StepPacer(target_s, context_weight=context_weight)
    errors = []
    for num_tokens, decodes, step_s, chunks in steps:
        if decodes and num_tokens - decodes >= MIN_SAMPLE_TOKENS and pacer.seconds_per_token is not None:
            pacer.step_budget(num_tokens, True, floor=0)  # what the scheduler asks before the step
            work = sum(chunk_work(c, n, context_weight) for c, n in chunks)
            errors.append(1000 * (pacer.decode_step_s + pacer.seconds_per_token * work - step_s))
        pacer.observe(num_tokens, decodes, step_s, chunks)
    return errors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("log", type=Path, help="a server log written with LOG_LEVEL=debug")
    parser.add_argument("--target-ms", type=float, default=300.0)
    parser.add_argument("--config", type=Path, default=None,
                        help="the served model's config.json (default: SmolLM2-135M's shape)")
    args = parser.parse_args()
    from tgi_llm.models.config import attention_cost_per_context_token
    from tgi_llm.models.registry import read_config

    shape = json.loads(args.config.read_text()) if args.config else SMOLLM2_SHAPE
    weight = attention_cost_per_context_token(read_config(shape))
    steps = read_steps(args.log)
    errors = prediction_errors_ms(steps, args.target_ms / 1000, weight)
    if not errors:
        sys.exit(f"no paced prompt steps in {args.log} ({len(steps)} step lines): was it LOG_LEVEL=debug?")
    n = len(errors)
    print(f"{len(steps)} steps, {n} paced prompt steps judged (context weight {weight:.3g})")
    print(f"| bias (predicted - measured) | mean abs error | under-predicted > 50 ms | > 100 ms | "
          f"over-predicted > 30 ms |\n|---|---|---|---|---|\n"
          f"| {statistics.mean(errors):+.1f} ms | {statistics.mean(map(abs, errors)):.1f} ms | "
          f"{sum(e < -50 for e in errors) / n:.1%} | {sum(e < -100 for e in errors) / n:.1%} | "
          f"{sum(e > 30 for e in errors) / n:.1%} |")


if __name__ == "__main__":
    main()
