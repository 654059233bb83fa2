"""The matmul floor: which products it runs and what it reports (no timing is asserted)."""

from __future__ import annotations

from tgi_llm.bench.floor import FloorMeter, MatmulFloor
from tgi_llm.models.loader import load_model


def test_floor_counts_every_linear_of_every_layer_and_the_lm_head(tiny_model_factory):
    model, _ = load_model(tiny_model_factory())
    floor = MatmulFloor(model, batch=3)
    cfg = model.config
    assert len(floor.calls) == 4 * cfg.num_hidden_layers + 1
    per_layer = sum(lin.dense_weight().numel() for lin in (model.layers[0].qkv, model.layers[0].o_proj,
                                                           model.layers[0].gate_up, model.layers[0].down))
    params = cfg.num_hidden_layers * per_layer + model.lm_head.numel()
    assert floor.flops == 2 * 3 * params
    assert floor.weight_bytes == 4 * params  # float32
    assert floor.run() > 0


def test_meter_keeps_each_phase_apart(tiny_model_factory):
    model, _ = load_model(tiny_model_factory())
    meter = FloorMeter(model, [4, 1, 4])
    meter.sample(2, "before")
    meter.sample(3, "after")
    points = meter.points()
    assert [p.batch_size for p in points] == [1, 4]
    for p in points:
        assert set(p.median_by_phase_s) == {"before", "after"}
        assert 0 < p.min_s <= p.median_s
        assert p.gflops_per_s > 0 and p.weight_gb_per_s > 0
