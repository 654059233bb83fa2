"""Convert a GGUF file into a plain HF model directory (dequantized safetensors + config + tokenizer).

transformers can read GGUF but `save_pretrained` refuses a GGUF-quantized model, so the
pieces are written by hand. Weights stay float32: dequantized GGUF values are exact there.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors.torch import save_file
from tqdm import tqdm

from tgi_llm.weights.gguf_checks import check_servable
from tgi_llm.weights.gguf_marker import MARKER_FILE

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


@contextlib.contextmanager
def _transformers_progress(enabled: bool) -> Iterator[None]:
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    if not enabled and was_enabled:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if not enabled and was_enabled:
            hf_logging.enable_progress_bar()


@contextlib.contextmanager
def _gguf_parsed_once() -> Iterator[None]:
    """transformers' GGUF loader opens the file three times (config, tokenizer, weights), and each GGUFReader
    parses every header field again: for SmolLM2's 49k-token vocabulary 5.7 s each (441k fields, a numpy
    view apiece). It also builds gguf's tensor-name map once per module of the model (397 times, 6.6 s).
    Both are read-only once made, so here each is made once: the conversion took 21 s, most of it this.
    The loader imports both from `gguf` at call time; where another transformers does not, nothing changes."""
    import gguf

    make_reader, make_name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    readers: dict[tuple, object] = {}
    name_maps: dict[tuple, object] = {}

    def reader(path, *args, **kwargs):
        key = (os.fspath(path), args, tuple(sorted(kwargs.items())))
        if key not in readers:
            readers[key] = make_reader(path, *args, **kwargs)
        return readers[key]

    def name_map(*args):
        if args not in name_maps:
            name_maps[args] = make_name_map(*args)
        return name_maps[args]

    gguf.GGUFReader, gguf.get_tensor_name_map = reader, name_map
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = make_reader, make_name_map


def _phase(step: int, message: str, t0: float) -> None:
    logger.info("GGUF conversion [%d/4] %s (%.1fs)", step, message, time.monotonic() - t0)


def convert_gguf(gguf_path: str | Path, out_dir: str | Path, progress: bool = True) -> Path:
    """Write a HF directory for `gguf_path` at `out_dir` (must not exist); atomic via a temp dir + rename."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_path = Path(gguf_path).resolve()
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp_dir = out_dir.parent / f".tmp-{out_dir.name}-{os.getpid()}"
    shutil.rmtree(tmp_dir, ignore_errors=True)
    tmp_dir.mkdir()
    t0 = time.monotonic()
    try:
        with _transformers_progress(progress), _gguf_parsed_once():
            import gguf

            extra_config = check_servable(gguf.GGUFReader(gguf_path), gguf_path.name)  # the reader is kept
            _phase(1, f"dequantizing {gguf_path.name}", t0)
            model = AutoModelForCausalLM.from_pretrained(
                str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32
            )
            tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
        config = model.config
        tied = bool(getattr(config, "tie_word_embeddings", False))

        _phase(2, "writing model.safetensors", t0)
        state = {}
        for name, tensor in tqdm(
            model.state_dict().items(), desc="GGUF tensors", disable=not progress, unit="t", leave=False
        ):
            if tied and name == "lm_head.weight":
                continue  # tied to the embedding; loaders re-tie it
            state[name] = tensor.detach().to(torch.float32).contiguous()
        save_file(state, str(tmp_dir / "model.safetensors"), metadata={"format": "pt"})
        os.chmod(tmp_dir / "model.safetensors", 0o644)  # save_file makes it 0600; the cache may be shared
        del state, model

        _phase(3, "writing config.json and tokenizer", t0)
        config_dict = {k: v for k, v in config.to_dict().items() if k not in _CONFIG_DROP}
        config_dict.update(extra_config)
        config_dict["dtype"] = "float32"
        config_dict["architectures"] = config_dict.get("architectures") or [
            type(config).__name__.replace("Config", "ForCausalLM")
        ]
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
