"""Load the YAML under deploy/, render its kustomize overlays, and validate objects offline.

Core kinds validate with kubernetes-validate (the Kubernetes JSON schemas it ships; strict: unknown fields
fail). Custom resources validate with jsonschema against the CRD schemas vendored in schemas/ (README.md
there), made strict the way the API server's field validation is: an object with `properties` takes no
other field unless its schema preserves unknown fields.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
SCHEMAS = Path(__file__).resolve().parent / "schemas"

# The oldest Kubernetes the manifests claim (preStop `sleep` is on by default from 1.30) and the newest
# kubernetes-validate knows: a field removed or renamed since fails one of them.
K8S_VERSIONS = ("1.30", kubernetes_validate.utils.latest_version())

# apiVersion, kind -> vendored schema file.
CRD_SCHEMAS = {
    ("inference.networking.k8s.io/v1", "InferencePool"): "inferencepool-v1.json",
    ("gateway.networking.k8s.io/v1", "Gateway"): "gateway-v1.json",
    ("gateway.networking.k8s.io/v1", "HTTPRoute"): "httproute-v1.json",
    ("serving.kserve.io/v1alpha1", "ServingRuntime"): "servingruntime-v1alpha1.json",
    ("serving.kserve.io/v1beta1", "InferenceService"): "inferenceservice-v1beta1.json",
}
KUSTOMIZATION = ("kustomize.config.k8s.io/v1beta1", "Kustomization")
OBJECT_META = {"name", "namespace", "labels", "annotations"}
LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when PyYAML has it: ~10x faster


def load_all(text: str) -> list[Any]:
    return [body for body in yaml.load_all(text, Loader=LOADER) if body is not None]


@dataclass(frozen=True)
class Doc:
    path: Path
    index: int
    body: Any

    @property
    def kind(self) -> str:
        return self.body.get("kind", "") if isinstance(self.body, dict) else ""

    @property
    def name(self) -> str:
        return self.body.get("metadata", {}).get("name", "") if isinstance(self.body, dict) else ""

    def __str__(self) -> str:
        return f"{self.path.relative_to(ROOT)}#{self.index} {self.kind}/{self.name}"


def load_docs(root: Path = DEPLOY) -> list[Doc]:
    docs = []
    for path in sorted(root.rglob("*.y*ml")):
        docs += [Doc(path, index, body) for index, body in enumerate(load_all(path.read_text()))]
    return docs


def objects(docs: list[Doc]) -> list[Doc]:
    """The Kubernetes objects: not kustomizations, not JSON patches (lists)."""
    return [d for d in docs if isinstance(d.body, dict) and (d.body.get("apiVersion"), d.kind) != KUSTOMIZATION]


def find(docs: list[Doc], kind: str, name: str | None = None) -> list[Doc]:
    return [d for d in objects(docs) if d.kind == kind and (name is None or d.name == name)]


# --- validation -------------------------------------------------------------------------------------------


def validate_core(body: dict[str, Any]) -> None:
    """kubernetes_validate.ValidationError (a jsonschema error) when `body` is not valid on every version."""
    for version in K8S_VERSIONS:
        kubernetes_validate.validate(body, version, strict=True)


def strict_schema(node: Any) -> Any:
    """An OpenAPI v3 CRD schema as a JSON Schema that refuses unknown fields and knows `nullable`."""
    if isinstance(node, list):
        return [strict_schema(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: strict_schema(v) for k, v in node.items()}
    for key in ("properties", "patternProperties"):
        if key in node:
            out[key] = {k: strict_schema(v) for k, v in node[key].items()}
    if out.pop("nullable", False) and "type" in out:
        out["type"] = [out["type"], "null"]
    if out.get("x-kubernetes-int-or-string") and "anyOf" not in out:
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if "properties" in out and "additionalProperties" not in out and not out.get(
            "x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    return out


@cache
def crd_validator(schema_file: str) -> jsonschema.Validator:
    vendored = json.loads((SCHEMAS / schema_file).read_text())
    return jsonschema.Draft7Validator(strict_schema(vendored["openAPIV3Schema"]))


def validate_custom(body: dict[str, Any]) -> None:
    """jsonschema.ValidationError when `body` does not fit its CRD's schema (or has unknown metadata)."""
    key = (body.get("apiVersion"), body.get("kind"))
    if key not in CRD_SCHEMAS:
        raise jsonschema.ValidationError(f"no vendored schema for {key}")
    crd_validator(CRD_SCHEMAS[key]).validate(body)
    # CRD schemas leave metadata open (the API server checks it as ObjectMeta): the fields we write, by name.
    extra = set(body.get("metadata", {})) - OBJECT_META
    if extra or not body.get("metadata", {}).get("name"):
        raise jsonschema.ValidationError(f"metadata: unknown fields {sorted(extra)} or no name")


@cache
def epp_config_validator() -> jsonschema.Validator:
    schema = json.loads((SCHEMAS / "endpointpickerconfig-v1alpha1.json").read_text())
    return jsonschema.Draft202012Validator(schema)


def validate_object(body: dict[str, Any]) -> None:
    if (body.get("apiVersion"), body.get("kind")) in CRD_SCHEMAS:
        validate_custom(body)
    else:
        validate_core(body)


# --- kustomize --------------------------------------------------------------------------------------------


def apply_json_patch(target: Any, ops: list[dict[str, Any]]) -> Any:
    """RFC 6902 add / replace / remove (what our overlays use); KeyError or IndexError on a bad path."""
    result = copy.deepcopy(target)
    for op in ops:
        *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        node = result
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        if op["op"] not in ("add", "replace", "remove"):
            raise ValueError(f"unsupported op {op['op']}")
        if isinstance(node, list):
            index = len(node) if last == "-" else int(last)
            if op["op"] == "add":
                node.insert(index, copy.deepcopy(op["value"]))
            elif op["op"] == "replace":
                node[index] = copy.deepcopy(op["value"])
            else:
                del node[index]
        else:
            if op["op"] != "add" and last not in node:
                raise KeyError(f"{op['path']}: nothing to {op['op']}")  # as RFC 6902 requires
            if op["op"] == "remove":
                del node[last]
            else:
                node[last] = copy.deepcopy(op["value"])
    return result


def render(kustomization_dir: Path) -> list[dict[str, Any]]:
    """The objects `kustomize build` would give for what our kustomizations use: resources and patches."""
    spec = yaml.safe_load((kustomization_dir / "kustomization.yaml").read_text())
    out: list[dict[str, Any]] = []
    for resource in spec.get("resources", []):
        path = (kustomization_dir / resource).resolve()
        if path.is_dir():
            out += render(path)
        else:
            out += load_all(path.read_text())
    for patch in spec.get("patches", []):
        ops = yaml.safe_load((kustomization_dir / patch["path"]).read_text())
        target = patch["target"]
        matched = [i for i, o in enumerate(out) if o["kind"] == target["kind"] and
                   o["metadata"]["name"] == target["name"] and
                   o["apiVersion"] == "/".join(p for p in (target.get("group"), target["version"]) if p)]
        if not matched:
            raise LookupError(f"patch {patch['path']} matches nothing")
        for i in matched:
            out[i] = apply_json_patch(out[i], ops)
    return out
