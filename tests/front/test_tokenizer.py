"""The front's tokenizer: the generic class for converted GGUF directories (no torch in the process), the
same chat prompts and token ids as AutoTokenizer, and AutoTokenizer for any other class."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

from transformers import AutoTokenizer

from tgi_llm.front.tokenizer import load_tokenizer

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Héllo, wörld! 1+1=?"}]


def test_a_converted_directory_loads_without_torch(default_model_dir):
    code = ("import sys; from tgi_llm.front.tokenizer import load_tokenizer;"
            f"t = load_tokenizer({str(default_model_dir)!r}); print(type(t).__name__, 'torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["TokenizersBackend", "False"]


def test_the_generic_class_renders_and_tokenizes_like_auto_tokenizer(default_model_dir):
    ours, auto = load_tokenizer(default_model_dir), AutoTokenizer.from_pretrained(str(default_model_dir))
    prompt = ours.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert prompt == auto.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert ours(prompt)["input_ids"] == auto(prompt)["input_ids"]
    assert ours.decode(auto(prompt)["input_ids"]) == auto.decode(auto(prompt)["input_ids"])


def test_another_class_goes_through_auto_tokenizer(default_model_dir, tmp_path, monkeypatch):
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(default_model_dir / name, tmp_path / name)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({**config, "tokenizer_class": "GPT2Tokenizer"}))
    seen = []
    monkeypatch.setattr(AutoTokenizer, "from_pretrained", lambda path, **kw: seen.append(path) or "auto")
    assert load_tokenizer(tmp_path) == "auto" and seen == [str(tmp_path)]
