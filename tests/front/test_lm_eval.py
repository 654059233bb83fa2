"""lm-evaluation-harness, unchanged, against the front's /v1/completions (`local-completions`, tokenized
requests): a multiple-choice task and a perplexity (loglikelihood_rolling) task on data shipped in
tests/data/lm_eval; every log-likelihood it reports equals what transformers computes on the same weights
(within 1e-3), as lm-eval's own `hf` model would."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
LM_EVAL = ROOT / ".venv-clients" / "bin" / "lm_eval"
DATA = ROOT / "tests" / "data" / "lm_eval"

TASKS = {
    "tiny_mc": f"""task: tiny_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {DATA / "tiny_mc.jsonl"}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
metric_list:
  - metric: acc
""",
    "tiny_rolling": f"""task: tiny_rolling
dataset_path: json
dataset_kwargs:
  data_files:
    test: {DATA / "tiny_rolling.jsonl"}
test_split: test
output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{{{text}}}}"
metric_list:
  - metric: word_perplexity
""",
}


@pytest.fixture(scope="module")
def reference(default_model_dir):
    """log P(continuation | context) under transformers, the pair tokenized as lm-eval tokenizes it."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(default_model_dir)
    model = AutoModelForCausalLM.from_pretrained(default_model_dir, dtype=torch.float32).eval()

    def encode(text: str) -> list[int]:
        return tok.encode(text, add_special_tokens=False)

    def loglikelihood(context: str, continuation: str) -> float:
        spaces = len(context) - len(context.rstrip())  # lm-eval's TemplateLM._encode_pair
        if spaces:
            continuation, context = context[-spaces:] + continuation, context[:-spaces]
        prefix = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id  # lm-eval's prefix token
        context_ids = encode(context) if context else [prefix]  # rolling: the text after the prefix token
        whole = encode(context + continuation) if context else context_ids + encode(continuation)
        target = whole[len(context_ids):]
        ids = torch.tensor([context_ids + target])
        with torch.no_grad():
            logprobs = torch.log_softmax(model(ids).logits[0].float(), -1)
        rows = range(len(context_ids) - 1, ids.shape[1] - 1)
        return sum(logprobs[r, ids[0, r + 1]].item() for r in rows)

    return loglikelihood


def test_lm_eval_loglikelihoods_equal_transformers(stack, default_model_dir, reference, tmp_path):
    if not LM_EVAL.exists():
        pytest.skip("lm-eval is installed by scripts/setup-clients.sh")
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    for name, config in TASKS.items():
        (tasks / f"{name}.yaml").write_text(config, encoding="utf-8")
    out = tmp_path / "out"
    args = ["model=SmolLM2", f"base_url={stack.front}/v1/completions", f"tokenizer={default_model_dir}",
            "tokenized_requests=True", "num_concurrent=2", "max_retries=1", "tokenizer_backend=huggingface"]
    env = dict(os.environ, HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    done = subprocess.run([str(LM_EVAL), "--model", "local-completions", "--model_args", ",".join(args),
                           "--tasks", "tiny_mc,tiny_rolling", "--include_path", str(tasks), "--output_path", str(out),
                           "--log_samples", "--batch_size", "1"], env=env, capture_output=True, text=True,
                          timeout=1200)
    assert done.returncode == 0, done.stderr[-4000:]
    samples = {name: [json.loads(line) for path in out.rglob(f"samples_{name}_*.jsonl")
                      for line in path.read_text(encoding="utf-8").splitlines()] for name in TASKS}
    assert len(samples["tiny_mc"]) == 6 and len(samples["tiny_rolling"]) == 3
    compared = 0
    for sample in samples["tiny_mc"]:
        arguments = sample["arguments"]
        arguments = list(arguments.values()) if isinstance(arguments, dict) else arguments
        for argument, resp in zip(arguments, sample["resps"], strict=True):
            context, continuation = _pair(argument)
            assert abs(float(resp[0][0]) - reference(context, continuation)) < 1e-3, (context, continuation)
            compared += 1
    for sample in samples["tiny_rolling"]:
        got = sample["resps"][0][0]
        got = got[0] if isinstance(got, list) else got
        assert abs(float(got) - reference("", sample["doc"]["text"])) < 1e-3
        compared += 1
    assert compared == 21 + 3  # every choice of every question, every text
    results = json.loads(next(out.rglob("results_*.json")).read_text(encoding="utf-8"))["results"]
    assert 0 <= results["tiny_mc"]["acc,none"] <= 1 and results["tiny_rolling"]["word_perplexity,none"] > 1


def _pair(argument) -> tuple[str, str]:
    """A logged request's (context, continuation): a list, or {"arg_0": ..., "arg_1": ...} in newer lm-eval."""
    return (argument["arg_0"], argument["arg_1"]) if isinstance(argument, dict) else (argument[0], argument[1])
