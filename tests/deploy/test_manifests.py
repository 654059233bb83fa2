"""Every YAML document under deploy/ is a valid object of its kind, offline (no cluster, no network)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import jsonschema
import pytest

from tests.deploy.manifests import DEPLOY, find, load_docs, objects, render, validate_object

DOCS = load_docs()
OVERLAYS = sorted(p for p in (DEPLOY / "kubernetes/overlays").iterdir() if p.is_dir())


def test_every_kind_the_deployment_needs_is_there():
    kinds = {d.kind for d in objects(DOCS)}
    assert kinds >= {"Deployment", "Service", "HorizontalPodAutoscaler", "PersistentVolumeClaim", "Secret",
                     "ConfigMap", "Job", "ServiceAccount", "Role", "RoleBinding", "InferencePool", "Gateway",
                     "HTTPRoute", "ServingRuntime", "InferenceService"}


@pytest.mark.parametrize("doc", objects(DOCS), ids=str)
def test_object_is_valid(doc):
    validate_object(doc.body)


@pytest.mark.parametrize("overlay", OVERLAYS, ids=lambda p: p.name)
def test_overlay_renders_valid_objects(overlay):
    rendered = render(overlay)
    assert rendered
    for body in rendered:
        validate_object(body)


def test_gpu_overlay_asks_for_one_gpu_and_tolerates_gpu_nodes():
    (deployment,) = [o for o in render(DEPLOY / "kubernetes/overlays/gpu") if o["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    # The patch replaced resources only: probes, args and volumes are the base's.
    (base,) = find(DOCS, "Deployment", "tgi-llm")
    assert pod["containers"][0]["args"] == base.body["spec"]["template"]["spec"]["containers"][0]["args"]


def test_base_deployment_contract():
    (doc,) = find(DOCS, "Deployment", "tgi-llm")
    pod = doc.body["spec"]["template"]
    container = pod["spec"]["containers"][0]
    assert container["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": "triton-http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": "triton-http"}
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 600  # model load takes minutes
    assert pod["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
    assert set(container["resources"]["requests"]) >= {"cpu", "memory"}
    assert container["resources"]["requests"] == container["resources"]["limits"]
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["models"]["persistentVolumeClaim"]["readOnly"] is True
    assert volumes["dshm"]["emptyDir"]["medium"] == "Memory"


# --- the validators refuse what the API server would ---------------------------------------------------------


def _one(kind: str, name: str | None = None) -> dict[str, Any]:
    return copy.deepcopy(find(DOCS, kind, name)[0].body)


def _container(body: dict[str, Any]) -> dict[str, Any]:
    return body["spec"]["template"]["spec"]["containers"][0]


BROKEN: list[tuple[str, str, Callable[[dict[str, Any]], None]]] = [
    ("Deployment", "misspelled container field", lambda b: _container(b).update(imagePullPolcy="Always")),
    ("Deployment", "string for an integer", lambda b: b["spec"]["template"]["spec"].update(
        terminationGracePeriodSeconds="135")),
    ("Deployment", "misspelled probe field", lambda b: _container(b)["readinessProbe"].update(period=5)),
    ("HorizontalPodAutoscaler", "v1 field in v2", lambda b: b["spec"].update(targetCPUUtilizationPercentage=80)),
    ("Service", "string port", lambda b: b["spec"]["ports"][0].update(port="3000")),
    ("InferencePool", "misspelled spec field", lambda b: b["spec"].update(targetPort=[{"number": 3000}])),
    ("InferencePool", "string port number", lambda b: b["spec"]["targetPorts"][0].update(number="3000")),
    ("InferencePool", "no endpoint picker", lambda b: b["spec"].pop("endpointPickerRef")),
    ("InferencePool", "unknown failure mode", lambda b: b["spec"]["endpointPickerRef"].update(failureMode="Open")),
    ("InferencePool", "unknown metadata field", lambda b: b["metadata"].update(label={"a": "b"})),
    ("HTTPRoute", "misspelled backendRef field", lambda b: b["spec"]["rules"][0]["backendRefs"][0].update(nmae="x")),
    ("HTTPRoute", "unknown path match type", lambda b: b["spec"]["rules"][0]["matches"][0]["path"].update(
        type="Prefix")),
    ("Gateway", "string listener port", lambda b: b["spec"]["listeners"][0].update(port="80")),
    ("ServingRuntime", "misspelled container field", lambda b: b["spec"]["containers"][0].update(agrs=[])),
    ("ServingRuntime", "misspelled volume source", lambda b: b["spec"]["volumes"][0].update(emptydir={})),
    ("InferenceService", "misspelled model field", lambda b: b["spec"]["predictor"]["model"].update(storageURI="x")),
    ("InferenceService", "string replica count", lambda b: b["spec"]["predictor"].update(minReplicas="1")),
]


@pytest.mark.parametrize(("kind", "what", "change"), BROKEN, ids=[f"{k}: {w}" for k, w, _ in BROKEN])
def test_validation_refuses(kind, what, change):
    body = _one(kind)
    validate_object(body)  # valid before the change
    change(body)
    with pytest.raises(jsonschema.ValidationError):
        validate_object(body)
