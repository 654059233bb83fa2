"""The manifests agree with each other and with the server: flags parse with the launcher's own parser, ports
and probes meet, the pool selects the servers, every metric named is one the server exports."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from tests.deploy import checks
from tests.deploy.manifests import Doc, load_docs

DOCS = load_docs()


def test_the_manifests_agree():
    assert checks.all_problems(DOCS) == []


def test_the_server_exports_the_gauges_the_pool_reads():
    assert checks.exported_gauges() >= {"vllm:num_requests_waiting", "vllm:num_requests_running",
                                        "vllm:kv_cache_usage_perc", "vllm:cache_config_info",
                                        "vllm:lora_requests_info"}


def test_every_launcher_is_checked():
    labels = [w.label for w in checks.workloads(DOCS)]
    assert len(labels) == 3, labels  # the base Deployment, the GPU overlay's, the KServe runtime's


def _changed(kind: str, name: str, change: Callable[[dict[str, Any]], Any]) -> list[Doc]:
    out = []
    for doc in DOCS:
        if doc.kind == kind and doc.name == name:
            body = copy.deepcopy(doc.body)
            change(body)
            doc = Doc(doc.path, doc.index, body)
        out.append(doc)
    return out


def _server(body: dict[str, Any]) -> dict[str, Any]:
    return body["spec"]["template"]["spec"]["containers"][0]


def _args(body: dict[str, Any], old: str, new: str | None) -> None:
    args = _server(body)["args"]
    index = next(i for i, a in enumerate(args) if a.startswith(old))
    if new is None:
        del args[index]
    else:
        args[index] = new


def _epp_config(body: dict[str, Any], change: Callable[[dict[str, Any]], Any]) -> None:
    config = yaml.safe_load(body["data"]["epp-config.yaml"])
    change(config)
    body["data"]["epp-config.yaml"] = yaml.safe_dump(config)


def _extractor(config: dict[str, Any]) -> dict[str, Any]:
    (plugin,) = [p for p in config["plugins"] if p["type"] == "core-metrics-extractor"]
    return plugin["parameters"]


SERVER = ("Deployment", "tgi-llm")
EPP = ("Deployment", "tgi-llm-epp")
EPP_CONFIG = ("ConfigMap", "tgi-llm-epp-config")
BROKEN = [
    ("misspelled launcher flag", SERVER, lambda b: _args(b, "--json-output", "--json-outptu"),
     "unrecognized arguments: --json-outptu"),
    ("launcher flag value of the wrong type", SERVER, lambda b: _args(b, "--port=", "--port=http"),
     "argument --port: invalid int value"),
    ("two launcher ports the same", SERVER, lambda b: _args(b, "--metrics-port=", "--metrics-port=8000"),
     "each port must differ"),
    ("grace period shorter than the drain", SERVER,
     lambda b: b["spec"]["template"]["spec"].update(terminationGracePeriodSeconds=95),
     "terminationGracePeriodSeconds 95 < 130"),
    ("drain timeout longer than the grace period", SERVER,
     lambda b: _args(b, "--graceful-termination-timeout=", "--graceful-termination-timeout=300"),
     "terminationGracePeriodSeconds 135 < 340"),
    ("drain timeout left to its default", SERVER, lambda b: _args(b, "--graceful-termination-timeout=", None),
     "is not passed explicitly"),
    ("readiness on a route behind the API key", SERVER,
     lambda b: _server(b)["readinessProbe"]["httpGet"].update(path="/v2/models/tgi_llm/generate"),
     "not a health route open without the API key"),
    ("probe on an undeclared port", SERVER, lambda b: _server(b)["livenessProbe"]["httpGet"].update(port=9999),
     "livenessProbe port 9999 is not a container port"),
    ("container port no launcher flag opens", SERVER,
     lambda b: _server(b)["ports"].append({"name": "extra", "containerPort": 9000}),
     "container port 9000 is not a launcher port"),
    ("Prometheus pointed at the API port", SERVER,
     lambda b: b["spec"]["template"]["metadata"]["annotations"].update({"prometheus.io/port": "3000"}),
     "Prometheus annotations"),
    ("threads not following the CPU limit", SERVER,
     lambda b: _server(b).update(env=[e for e in _server(b)["env"] if e["name"] != "OMP_NUM_THREADS"]),
     "OMP_NUM_THREADS"),
    ("API key from a Secret not provided", SERVER,
     lambda b: _server(b)["env"][0]["valueFrom"]["secretKeyRef"].update(name="api-key"),
     "which no Secret example provides"),
    ("image of another Triton release", SERVER,
     lambda b: _server(b).update(image="registry.example.com/tgi-llm:0.1.0-triton23.01"),
     "is not built on tritonserver"),
    ("replicas beside the HPA", SERVER, lambda b: b["spec"].update(replicas=2),
     "sets replicas, which the HPA owns"),
    ("Service port to no container port", ("Service", "tgi-llm"),
     lambda b: b["spec"]["ports"][0].update(targetPort="api"), "port http reaches no container port"),
    ("Service selecting no pods", ("Service", "tgi-llm-epp"),
     lambda b: b["spec"]["selector"].update({"app.kubernetes.io/name": "epp"}), "selects 0 Deployments"),
    ("pool selecting the picker too", ("InferencePool", "tgi-llm"),
     lambda b: b["spec"]["selector"].update(matchLabels={"app.kubernetes.io/name": "tgi-llm-epp"}),
     "which is no model server"),
    ("pool target port not the API", ("InferencePool", "tgi-llm"),
     lambda b: b["spec"]["targetPorts"][0].update(number=8000),
     "!= the launcher's --port"),
    ("pool's picker port not the picker's", ("InferencePool", "tgi-llm"),
     lambda b: b["spec"]["endpointPickerRef"]["port"].update(number=9090),
     "does not reach the picker's --grpc-port"),
    ("picker metric flag it refuses", EPP,
     lambda b: _server(b)["args"].append("--total-queued-requests-metric=vllm:num_requests_waiting"),
     "refuses to start with --total-queued-requests-metric"),
    ("picker flag it does not have", EPP, lambda b: _server(b)["args"].append("--model-server-type=vllm"),
     "has no flag --model-server-type"),
    ("picker serving another pool", EPP, lambda b: _args(b, "--pool-name=", "--pool-name=other"),
     "the picker serves pool other"),
    ("picker config not mounted", EPP, lambda b: _args(b, "--config-file=", "--config-file=/etc/epp.yaml"),
     "is no key of a mounted ConfigMap"),
    ("misspelled metric spec key", EPP_CONFIG,
     lambda b: _epp_config(b, lambda c: _extractor(c)["engineConfigs"][0].update(
         queuedRequestSpec=_extractor(c)["engineConfigs"][0].pop("queuedRequestsSpec"))),
     "'queuedRequestSpec' was unexpected"),
    ("metric the server does not export", EPP_CONFIG,
     lambda b: _epp_config(b, lambda c: _extractor(c)["engineConfigs"][0].update(
         kvUsageSpec="vllm:gpu_cache_usage_perc")),
     "'vllm:gpu_cache_usage_perc' is not a gauge the server exports"),
    ("engine the pods do not name", EPP_CONFIG,
     lambda b: _epp_config(b, lambda c: _extractor(c)["engineConfigs"][0].update(name="vllm")),
     "has no engineConfigs entry"),
    ("unknown plugin type", EPP_CONFIG,
     lambda b: _epp_config(b, lambda c: c["plugins"].append({"type": "queue-scorrer"})),
     "'queue-scorrer' is not one of"),
    ("profile naming a missing plugin", EPP_CONFIG,
     lambda b: _epp_config(b, lambda c: c["schedulingProfiles"][0]["plugins"].append({"pluginRef": "nope"})),
     "pluginRef nope names no plugin"),
    ("HPA on the raw gauge name", ("HorizontalPodAutoscaler", "tgi-llm"),
     lambda b: b["spec"]["metrics"][0]["pods"]["metric"].update(name="vllm:num_requests_waiting"),
     "metric vllm:num_requests_waiting is no exported gauge"),
    ("HPA on a metric no adapter rule serves", ("HorizontalPodAutoscaler", "tgi-llm"),
     lambda b: b["spec"]["metrics"][0]["pods"]["metric"].update(name="vllm_num_requests_running"),
     "metric vllm_num_requests_running is no exported gauge"),
    ("adapter renaming another gauge", ("ConfigMap", "adapter-config"),
     lambda b: b["data"].update({"config.yaml": b["data"]["config.yaml"].replace(
         "^vllm:num_requests_waiting$", "^vllm:num_requests_running$")}),
     "metric vllm_num_requests_waiting is no exported gauge"),
    ("route leaving chat completions out", ("HTTPRoute", "tgi-llm"),
     lambda b: b["spec"]["rules"][0]["matches"][0]["path"].update(value="/v1/completions"),
     "/v1/chat/completions is not routed"),
    ("route to an undeclared pool", ("HTTPRoute", "tgi-llm"),
     lambda b: b["spec"]["rules"][0]["backendRefs"][0].update(name="other"),
     "a backendRef names no InferencePool"),
    ("InferenceService on an undeclared runtime", ("InferenceService", "tgi-llm"),
     lambda b: b["spec"]["predictor"]["model"].update(runtime="kserve-huggingfaceserver"),
     "runtime kserve-huggingfaceserver is not declared"),
    ("InferenceService serving another directory", ("InferenceService", "tgi-llm"),
     lambda b: b["spec"]["predictor"]["model"].update(storageUri="pvc://tgi-llm-models/Other"),
     "serves Other"),
    ("runtime grace period shorter than the drain", ("InferenceService", "tgi-llm"),
     lambda b: b["spec"]["predictor"].update(terminationGracePeriodSeconds=30),
     "terminationGracePeriodSeconds 30 < 125"),
    ("runtime reading the model elsewhere", ("ServingRuntime", "tgi-llm"),
     lambda b: b["spec"]["containers"][0]["args"].__setitem__(1, "--model-id=/models/x"),
     "--model-id is not /mnt/models"),
    ("real-looking key in the Secret example", ("Secret", "tgi-llm-api-key"),
     lambda b: b["stringData"].update({"api-key": "0123456789abcdef"}),
     "is not a REPLACE-ME placeholder"),
    ("kustomization listing a missing file", ("Kustomization", ""),
     lambda b: b["resources"].append("missing.yaml"),
     "missing.yaml does not exist"),
]


@pytest.mark.parametrize(("what", "target", "change", "expected"), BROKEN, ids=[b[0] for b in BROKEN])
def test_cross_checks_catch(what, target, change, expected):
    docs = _changed(*target, change)
    assert docs != DOCS, f"nothing to change: {target}"
    problems = checks.all_problems(docs)
    assert any(expected in p for p in problems), problems
