"""Regenerate the vendored schemas in this folder from upstream git checkouts (see README.md here).

    python tests/deploy/schemas/vendor.py --gaie DIR --gateway-api DIR --kserve DIR

Each DIR is a clone (bare or not) of the upstream repository; the tags below are read with `git show`, so
the clone needs them. The test suite never runs this: it reads the JSON files written here, offline.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent

GAIE_TAG = "v1.5.0"  # the last release with the full endpoint picker (cmd/epp); v1.6.0 kept only lwepp
GATEWAY_API_TAG = "v1.6.1"
KSERVE_TAG = "v0.20.0"

# (output file, repository option, tag, path, served version, stubs): each stub is (dotted path of an object,
# `[]` stepping into an array's items; properties kept whole; size in bytes of JSON above which every other
# property there is cut to a bare stub). Stubs keep the files small: our manifests use none of those branches.
VOLUME_SOURCES = ("name", "emptyDir", "persistentVolumeClaim", "configMap", "secret")
CRDS = [
    ("inferencepool-v1.json", "gaie", GAIE_TAG,
     "config/crd/bases/inference.networking.k8s.io_inferencepools.yaml", "v1", []),
    ("gateway-v1.json", "gateway_api", GATEWAY_API_TAG,
     "config/crd/standard/gateway.networking.k8s.io_gateways.yaml", "v1", []),
    ("httproute-v1.json", "gateway_api", GATEWAY_API_TAG,
     "config/crd/standard/gateway.networking.k8s.io_httproutes.yaml", "v1", []),
    ("servingruntime-v1alpha1.json", "kserve", KSERVE_TAG,
     "config/crd/full/serving.kserve.io_servingruntimes.yaml", "v1alpha1",
     [("spec", ("containers", "volumes"), 3000), ("spec.volumes[]", VOLUME_SOURCES, 0)]),
    ("inferenceservice-v1beta1.json", "kserve", KSERVE_TAG,
     "config/crd/full/serving.kserve.io_inferenceservices.yaml", "v1beta1",
     [("spec", ("predictor",), 0), ("spec.predictor", ("model",), 3000)]),
]

# Documentation and CEL rules: jsonschema reads neither, and they are most of each file's size.
DROPPED_KEYS = {"description", "x-kubernetes-validations", "default", "example"}


def git_show(repo: Path, tag: str, path: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "show", f"{tag}:{path}"], check=True, capture_output=True,
                          text=True).stdout


def strip(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: strip(v) for k, v in node.items() if k not in DROPPED_KEYS}
    if isinstance(node, list):
        return [strip(v) for v in node]
    return node


def stub(schema: dict[str, Any]) -> dict[str, Any]:
    """A branch none of our manifests use: its type only (objects keep any content)."""
    cut: dict[str, Any] = {"type": schema.get("type", "object"), "x-vendored-stub": True}
    if cut["type"] == "object":
        cut["x-kubernetes-preserve-unknown-fields"] = True
    return cut


def apply_stubs(schema: dict[str, Any], stubs: list[tuple[str, tuple[str, ...], int]]) -> None:
    for dotted, kept, over in stubs:
        node = schema
        for part in dotted.split("."):
            node = node["properties"][part.removesuffix("[]")]
            if part.endswith("[]"):
                node = node["items"]
        for name, sub in node["properties"].items():
            if name not in kept and len(json.dumps(sub)) > over:
                node["properties"][name] = stub(sub)


def crd_schema(text: str, version: str, stubs: list[tuple[str, tuple[str, ...], int]]) -> dict[str, Any]:
    crd = yaml.safe_load(text)
    (served,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    schema = strip(served["schema"]["openAPIV3Schema"])
    schema["properties"].pop("status", None)  # written by controllers, never by a manifest
    apply_stubs(schema, stubs)
    return {
        "group": crd["spec"]["group"],
        "kind": crd["spec"]["names"]["kind"],
        "version": version,
        "openAPIV3Schema": schema,
    }


FLAG_CALL = re.compile(r'fs\.\w+Var[P]?\(&[\w.]+,\s*"([\w-]+)"')
DEPRECATED = re.compile(r'fs\.MarkDeprecated\("([\w-]+)"')
REJECTED_LIST = re.compile(r"deprecatedMetricFlags := \[\]string\{(.*?)\}", re.S)
# controller-runtime's zap.Options.BindFlags (added to the EPP's flag set by its logging options).
ZAP_FLAGS = ["zap-devel", "zap-encoder", "zap-log-level", "zap-stacktrace-level", "zap-time-encoding"]


def epp_flags(gaie: Path) -> dict[str, Any]:
    """The endpoint picker's flags at GAIE_TAG, and those it refuses to start with."""
    options = git_show(gaie, GAIE_TAG, "pkg/epp/server/options.go")
    logging_options = git_show(gaie, GAIE_TAG, "pkg/common/observability/logging/options.go")
    rejected = re.findall(r'"([\w-]+)"', REJECTED_LIST.search(options).group(1))
    return {
        "source": f"kubernetes-sigs/gateway-api-inference-extension@{GAIE_TAG}: pkg/epp/server/options.go, "
                  "pkg/common/observability/logging/options.go",
        "flags": sorted(set(FLAG_CALL.findall(options) + FLAG_CALL.findall(logging_options) + ZAP_FLAGS)),
        "deprecated": sorted(set(DEPRECATED.findall(options))),
        "rejected": sorted(rejected),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gaie", type=Path, required=True, help="kubernetes-sigs/gateway-api-inference-extension")
    parser.add_argument("--gateway-api", type=Path, required=True, help="kubernetes-sigs/gateway-api")
    parser.add_argument("--kserve", type=Path, required=True, help="kserve/kserve")
    args = parser.parse_args()
    for name, repo, tag, path, version, stubs in CRDS:
        schema = crd_schema(git_show(getattr(args, repo), tag, path), version, stubs)
        (HERE / name).write_text(json.dumps(schema, indent=1, sort_keys=True) + "\n")
    (HERE / f"epp-flags-{GAIE_TAG}.json").write_text(json.dumps(epp_flags(args.gaie), indent=1) + "\n")


if __name__ == "__main__":
    main()
