"""SafetensorsWeights: single file, sharded index, slices, and per-rank shards of fused linears."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from tgi_llm.models.weight_loader import WeightLoader
from tgi_llm.weights import NO_SHARD, SafetensorsWeights, Shard


def tensors() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return {
        "a.q_proj.weight": torch.randn(8, 6, generator=gen),
        "a.k_proj.weight": torch.randn(4, 6, generator=gen),
        "a.q_proj.bias": torch.randn(8, generator=gen),
        "a.k_proj.bias": torch.randn(4, generator=gen),
        "a.o_proj.weight": torch.randn(6, 8, generator=gen),
        "a.o_proj.bias": torch.randn(6, generator=gen),
    }


@pytest.fixture(params=["single", "sharded"])
def weights_dir(request, tmp_path):
    data = tensors()
    if request.param == "single":
        save_file(data, str(tmp_path / "model.safetensors"))
    else:
        names = sorted(data)
        halves = {"model-00001-of-00002.safetensors": names[:3], "model-00002-of-00002.safetensors": names[3:]}
        weight_map = {}
        for filename, part in halves.items():
            save_file({n: data[n] for n in part}, str(tmp_path / filename))
            weight_map.update(dict.fromkeys(part, filename))
        (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return tmp_path


def test_reads_every_tensor(weights_dir):
    weights = SafetensorsWeights(weights_dir)
    expected = tensors()
    assert weights.names() == sorted(expected)
    for name, tensor in weights.iter_tensors():
        torch.testing.assert_close(tensor, expected[name])
    assert "a.q_proj.weight" in weights and "nope" not in weights
    with pytest.raises(KeyError, match="nope"):
        weights.get_tensor("nope")


def test_slices_and_shards(weights_dir):
    weights = SafetensorsWeights(weights_dir)
    full = tensors()["a.o_proj.weight"]
    torch.testing.assert_close(weights.get_slice("a.o_proj.weight")[1:3], full[1:3])
    assert weights.shape("a.o_proj.weight") == [6, 8]
    rows = [weights.load_sharded("a.o_proj.weight", 0, Shard(r, 2)) for r in range(2)]
    cols = [weights.load_sharded("a.o_proj.weight", 1, Shard(r, 4)) for r in range(4)]
    torch.testing.assert_close(torch.cat(rows, 0), full)
    torch.testing.assert_close(torch.cat(cols, 1), full)
    assert cols[1].shape == (6, 2)
    with pytest.raises(ValueError, match="divisible"):
        weights.load_sharded("a.o_proj.weight", 0, Shard(0, 4))


def test_fused_column_and_row_parallel_linears(weights_dir):
    """Column-parallel fusion puts each rank's q slice then its k slice; row-parallel splits inputs
    and keeps the bias on rank 0 so the all-reduced sum adds it once."""
    data = tensors()

    def load_linear(prefixes, parallel, shard=NO_SHARD):
        loader = WeightLoader(weights_dir, None, None, shard)
        return loader.linear_weight(prefixes, parallel), loader.bias(prefixes, parallel)

    full_w, full_b = load_linear(["a.q_proj", "a.k_proj"], "column")
    torch.testing.assert_close(full_w, torch.cat([data["a.q_proj.weight"], data["a.k_proj.weight"]]))
    torch.testing.assert_close(full_b, torch.cat([data["a.q_proj.bias"], data["a.k_proj.bias"]]))
    w1, b1 = load_linear(["a.q_proj", "a.k_proj"], "column", Shard(1, 2))
    torch.testing.assert_close(w1, torch.cat([data["a.q_proj.weight"][4:], data["a.k_proj.weight"][2:]]))
    torch.testing.assert_close(b1, torch.cat([data["a.q_proj.bias"][4:], data["a.k_proj.bias"][2:]]))

    x = torch.randn(3, 8)
    partial = [load_linear(["a.o_proj"], "row", Shard(r, 2)) for r in range(2)]
    summed = sum(torch.nn.functional.linear(x[:, r * 4 : (r + 1) * 4], w, b) for r, (w, b) in enumerate(partial))
    torch.testing.assert_close(summed, torch.nn.functional.linear(x, data["a.o_proj.weight"], data["a.o_proj.bias"]))


def test_missing_files_are_reported(tmp_path):
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        SafetensorsWeights(tmp_path)
