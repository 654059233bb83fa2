"""The Triton Python-backend model (re-exported by model_repository/tgi_llm/1/model.py).

Thin on purpose: `initialize` builds the engine from the config's parameters, `execute` hands each
request to the adapter and returns None (decoupled: responses come from the responder thread),
`finalize` stops the engine and ends every request in flight with an error response.
"""

from __future__ import annotations

import gc
import json
import logging
import os
from typing import Any

import triton_python_backend_utils as pb_utils

from tgi_llm.launcher.logs import setup_logging
from tgi_llm.triton.adapter import TritonAdapter
from tgi_llm.triton.config import adapter_options, config_parameters, responder_options
from tgi_llm.triton.health import HealthWatchdog
from tgi_llm.triton.memory import IdleTrim
from tgi_llm.triton.metrics import TgiMetrics
from tgi_llm.triton.pb_api import PbRequestIO, PbResponses, pb_family_factory
from tgi_llm.triton.responder import Responder

logger = logging.getLogger("tgi_llm.triton")


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        config = json.loads(args["model_config"])
        params = config_parameters(config)
        setup_logging(os.environ.get("LOG_LEVEL"), params.get("json_output", "").lower() == "true")
        if not pb_utils.using_decoupled_model_transaction_policy(config):
            raise pb_utils.TritonModelException("tgi_llm needs model_transaction_policy { decoupled: true }")
        from tgi_llm.engine import EngineOptions, build_engine

        engine = build_engine(EngineOptions.from_parameters(params))
        limits = engine.limits
        logger.info("engine ready: %s", limits)
        metrics = TgiMetrics(pb_family_factory(pb_utils), limits.max_input_tokens, limits.max_total_tokens)
        metrics.cache_config(limits.block_size, limits.num_blocks)
        if hasattr(engine, "memory_account"):
            metrics.memory(engine.memory_account())
        responder = Responder(PbResponses(pb_utils), metrics, engine.stats, engine.drain_step_stats,
                              idle_trim=IdleTrim(), **responder_options(params))
        self.io = PbRequestIO(pb_utils)
        self.adapter = TritonAdapter(engine, responder, **adapter_options(params))
        self.adapter.start()
        self.watchdog = HealthWatchdog(lambda: engine.healthy, lambda: _unload_self(args["model_name"]))
        self.watchdog.start()

    def execute(self, requests: list[Any]) -> None:
        self.adapter.execute(requests, self.io)
        return None

    def finalize(self) -> None:
        logger.info("stopping the engine")
        self.watchdog.stop()
        self.adapter.finalize()
        # Every pb_utils object (metric families, response senders) must go while the stub can still talk
        # to tritonserver: destroyed later, at the interpreter's exit, they crash the stub.
        del self.adapter, self.watchdog, self.io
        gc.collect()
        logger.info("model finalized")


def _unload_self(model_name: str) -> None:
    """Readiness can only turn false by unloading (needs --model-control-mode=explicit, as the launcher
    starts tritonserver); under other modes the model stays loaded and answers every request with an error."""
    try:
        pb_utils.unload_model(model_name)
    except Exception as exc:
        logger.error("could not unload %s after an engine failure (%s); requests will get errors", model_name, exc)
