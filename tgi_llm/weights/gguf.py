"""Convert a GGUF file into a plain HF model directory (dequantized safetensors + config + tokenizer).

The config comes from the file's metadata and llama.cpp's per-architecture conventions (gguf_config.py),
the tensors from its data under Hugging Face's names (gguf_state.py), the tokenizer from transformers'
GGUF tokenizer reader. Weights stay float32: dequantized GGUF values are exact there. The written tensors
must be exactly those of the model the config describes, or the file is refused.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from pathlib import Path

import torch
from safetensors.torch import save_file
from tqdm import tqdm

from tgi_llm.weights.gguf_checks import check_servable
from tgi_llm.weights.gguf_config import hf_config
from tgi_llm.weights.gguf_marker import MARKER_FILE
from tgi_llm.weights.gguf_state import hf_tensors

logger = logging.getLogger(__name__)

#: PretrainedConfig bookkeeping that is noise in a written config.json (and the GGUF quantization
#: entry, which would make loaders expect a GGUF file).
_CONFIG_DROP = {
    "quantization_config",
    "_name_or_path",
    "_model_name_or_path",
    "id2label",
    "label2id",
    "problem_type",
    "return_dict",
    "output_attentions",
    "output_hidden_states",
    "chunk_size_feed_forward",
    "is_encoder_decoder",
}


def _phase(step: int, message: str, t0: float) -> None:
    logger.info("GGUF conversion [%d/4] %s (%.1fs)", step, message, time.monotonic() - t0)


def convert_gguf(gguf_path: str | Path, out_dir: str | Path, progress: bool = True) -> Path:
    """Write a HF directory for `gguf_path` at `out_dir` (must not exist); atomic via a temp dir + rename."""
    from transformers import AutoConfig

    gguf_path = Path(gguf_path).resolve()
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp_dir = out_dir.parent / f".tmp-{out_dir.name}-{os.getpid()}"
    shutil.rmtree(tmp_dir, ignore_errors=True)
    tmp_dir.mkdir()
    t0 = time.monotonic()
    try:
        import gguf

        reader = gguf.GGUFReader(gguf_path)
        layout = check_servable(reader, gguf_path.name)
        config = AutoConfig.for_model(**hf_config(reader, layout, gguf_path.name))
        _phase(1, f"dequantizing {gguf_path.name}", t0)
        state = dict(tqdm(hf_tensors(reader, layout, config.num_attention_heads, config.num_key_value_heads),
                          desc="GGUF tensors", disable=not progress, unit="t", leave=False))
        _check_complete(state, config, gguf_path.name)
        tokenizer = _gguf_tokenizer(gguf_path)

        _phase(2, "writing model.safetensors", t0)
        save_file(state, str(tmp_dir / "model.safetensors"), metadata={"format": "pt"})
        os.chmod(tmp_dir / "model.safetensors", 0o644)  # save_file makes it 0600; the cache may be shared
        del state

        _phase(3, "writing config.json and tokenizer", t0)
        config_dict = {k: v for k, v in config.to_dict().items() if k not in _CONFIG_DROP}
        config_dict["dtype"] = "float32"
        (tmp_dir / "config.json").write_text(json.dumps(config_dict, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        # chat_template inside tokenizer_config.json (not chat_template.jinja): older readers expect it there.
        tokenizer.save_pretrained(str(tmp_dir), save_jinja_files=False)
        _portable_tokenizer_config(tmp_dir / "tokenizer_config.json")
        _write_generation_config(tmp_dir, config_dict, tokenizer)

        _phase(4, f"finalizing {out_dir}", t0)
        stat = gguf_path.stat()
        marker = {"gguf": str(gguf_path), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
        (tmp_dir / MARKER_FILE).write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")
        try:
            os.rename(tmp_dir, out_dir)
        except OSError:
            if not (out_dir / MARKER_FILE).is_file():
                raise
            shutil.rmtree(tmp_dir, ignore_errors=True)  # another process finished first: keep theirs
    except BaseException:
        shutil.rmtree(tmp_dir, ignore_errors=True)
        raise
    logger.info("GGUF conversion done in %.1fs: %s", time.monotonic() - t0, out_dir)
    return out_dir


def _gguf_tokenizer(gguf_path: Path):
    """The tokenizer the file describes, from the file alone (not from tokenizer files that happen to sit
    beside it), as transformers builds it for `gguf_file=`."""
    from transformers import PreTrainedTokenizerFast
    from transformers.integrations.gguf import convert_gguf_tokenizer, get_gguf_tokenizer

    architecture, tokenizer_dict, tokenizer_config = get_gguf_tokenizer(str(gguf_path))
    backend, extra = convert_gguf_tokenizer(architecture, tokenizer_dict)
    return PreTrainedTokenizerFast(tokenizer_object=backend, **tokenizer_config, **extra)


def _check_complete(state: dict[str, torch.Tensor], config, name: str) -> None:
    """The file's tensors must be exactly the model's, in its shapes: none missing (a weight left at random),
    none left over (a bias or a layer the model would ignore)."""
    from transformers import AutoModelForCausalLM
    from transformers.core_model_loading import revert_weight_conversion

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    # as save_pretrained writes it: transformers 5 stacks experts in memory, checkpoints keep one per expert
    expected = {k: v.shape for k, v in revert_weight_conversion(model, model.state_dict()).items()}
    if config.tie_word_embeddings:
        expected.pop("lm_head.weight", None)
    missing, unused = expected.keys() - state.keys(), state.keys() - expected.keys()
    for what, names in (("missing", missing), ("not used by the model", unused)):
        if names:
            raise ValueError(f"{name}: tensors {what}: {', '.join(sorted(names)[:4])}"
                             f"{' ...' if len(names) > 4 else ''}; refusing to serve it")
    for key, shape in expected.items():
        if state[key].shape != shape:
            raise ValueError(f"{name}: tensor {key} is {tuple(state[key].shape)} where the model described by "
                             f"its metadata has {tuple(shape)}; refusing to serve it")


def _portable_tokenizer_config(path: Path) -> None:
    """transformers 5 names its fast tokenizer class `TokenizersBackend`; older readers (and TGI) know
    it as `PreTrainedTokenizerFast`. Also drop load-time flags that leaked into the saved file."""
    cfg = json.loads(path.read_text(encoding="utf-8"))
    if cfg.get("tokenizer_class") == "TokenizersBackend":
        cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    for key in ("is_local", "local_files_only", "backend"):
        cfg.pop(key, None)
    path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _write_generation_config(out_dir: Path, config: dict, tokenizer) -> None:
    """eos/bos for the generation loop; the tokenizer's eos wins (for chat models it is the turn end)."""
    eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else config.get("eos_token_id")
    bos = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else config.get("bos_token_id")
    gen: dict = {"_from_model_config": True}
    if bos is not None:
        gen["bos_token_id"] = bos
    if eos is not None:
        gen["eos_token_id"] = eos
    pad = config.get("pad_token_id")
    if pad is not None:
        gen["pad_token_id"] = pad
    (out_dir / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n", encoding="utf-8")
