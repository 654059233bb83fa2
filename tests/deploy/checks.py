"""Cross-checks between the manifests under deploy/ and the server they run.

Each check returns the problems it found (empty: fine), so a test can show it passes on the real manifests
and fails on a broken copy of them.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import io
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import PurePosixPath
from typing import Any

import yaml

from tests.deploy.manifests import DEPLOY, LOADER, ROOT, SCHEMAS, Doc, epp_config_validator, find, render

LAUNCHER = "tgi-llm-launcher"
GAUGE_DICT = "_GAUGES"  # tgi_llm/triton/metrics.py: name -> description of every gauge the server exports


@cache
def exported_gauges() -> frozenset[str]:
    """The gauge names tgi_llm/triton/metrics.py declares, read from its source (no import of the model)."""
    tree = ast.parse((ROOT / "tgi_llm/triton/metrics.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.AnnAssign | ast.Assign):
            targets = [node.target] if isinstance(node, ast.AnnAssign) else node.targets
            if any(isinstance(t, ast.Name) and t.id == GAUGE_DICT for t in targets):
                return frozenset(ast.literal_eval(node.value))
    raise LookupError(f"{GAUGE_DICT} not found in tgi_llm/triton/metrics.py")


def metric_name(spec: str) -> str:
    """A Prometheus metric spec's name: `nv_x{type=waiting}` -> `nv_x`."""
    return spec.split("{", 1)[0].strip()


# --- the launcher's containers ------------------------------------------------------------------------------


@dataclass
class Workload:
    """A pod running the launcher, however it is declared."""

    label: str
    container: dict[str, Any]
    pod_labels: dict[str, str]
    prometheus: dict[str, str]  # prometheus.io/* (or KServe's prometheus.kserve.io/*) annotations, short keys
    grace_s: int | None
    secrets: list[Doc]


@cache
def rendered_overlays() -> tuple[dict[str, Any], ...]:
    """deploy/kubernetes/overlays/*, rendered once (read from disk: the docs a test changes are the files')."""
    return tuple(o for d in sorted((DEPLOY / "kubernetes/overlays").iterdir()) if d.is_dir() for o in render(d))


def workloads(docs: list[Doc]) -> Iterator[Workload]:
    secrets = find(docs, "Secret")
    rendered = rendered_overlays()
    deployments = [(str(d), d.body) for d in find(docs, "Deployment")]
    deployments += [(f"overlay Deployment/{o['metadata']['name']}", o) for o in rendered if o["kind"] == "Deployment"]
    for label, body in deployments:
        pod = body["spec"]["template"]
        for container in pod["spec"]["containers"]:
            if container.get("args", [None])[0] == LAUNCHER:
                meta = pod["metadata"]
                yield Workload(label, container, meta.get("labels", {}),
                               _short(meta.get("annotations", {}), "prometheus.io/"),
                               pod["spec"].get("terminationGracePeriodSeconds", 30), secrets)
    for isvc in find(docs, "InferenceService"):
        model = isvc.body["spec"]["predictor"]["model"]
        for runtime in find(docs, "ServingRuntime", model["runtime"]):
            container = dict(runtime.body["spec"]["containers"][0])
            container["resources"] = model.get("resources", {})  # KServe puts the model's on kserve-container
            yield Workload(f"{isvc} on {runtime}", container, {},
                           _short(runtime.body["spec"].get("annotations", {}), "prometheus.kserve.io/"),
                           isvc.body["spec"]["predictor"].get("terminationGracePeriodSeconds", 30), secrets)


def _short(annotations: dict[str, str], prefix: str) -> dict[str, str]:
    return {k.removeprefix(prefix): v for k, v in annotations.items() if k.startswith(prefix)}


def launcher_args(container: dict[str, Any]) -> argparse.Namespace:
    """The container's launcher flags (and literal env values) parsed and checked by the launcher itself."""
    from tgi_llm.launcher.args import build_parser, validate

    if container.get("command") or container.get("args", [None])[0] != LAUNCHER:
        raise ValueError(f"the container does not run {LAUNCHER} through the image's entrypoint")
    env = {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            args = build_parser(env).parse_args(container["args"][1:])
    except SystemExit:
        raise ValueError(stderr.getvalue().strip().splitlines()[-1]) from None
    return validate(args)


def parsed(container: dict[str, Any]) -> argparse.Namespace | None:
    """launcher_args, or None when they do not parse (check_launcher reports why)."""
    try:
        return launcher_args(container)
    except Exception:
        return None


def check_launcher(w: Workload) -> list[str]:
    try:
        args = launcher_args(w.container)
    except Exception as exc:  # the launcher's own messages
        return [f"{w.label}: {exc}"]
    return [f"{w.label}: {p}" for p in (*_grace(w, args), *_ports(w, args), *_prometheus(w, args), *_env(w))]


def _grace(w: Workload, args: argparse.Namespace) -> list[str]:
    """SIGTERM -> tritonserver drains for --graceful-termination-timeout, then the gateway and front stop."""
    from tgi_llm.launcher.front import STOP_TIMEOUT_S as FRONT_STOP_S
    from tgi_llm.launcher.gateway import STOP_TIMEOUT_S as GATEWAY_STOP_S

    problems = []
    if not any(a.startswith("--graceful-termination-timeout") for a in w.container["args"]):
        problems.append("--graceful-termination-timeout is not passed explicitly")
    pre_stop = w.container.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds", 0)
    needed = pre_stop + args.graceful_termination_timeout + (FRONT_STOP_S if args.port else GATEWAY_STOP_S)
    if w.grace_s is None or w.grace_s < needed:
        problems.append(f"terminationGracePeriodSeconds {w.grace_s} < {needed:g} (preStop {pre_stop} + "
                        f"--graceful-termination-timeout {args.graceful_termination_timeout} + children's stop)")
    return problems


def _ports(w: Workload, args: argparse.Namespace) -> list[str]:
    """Declared ports are the launcher's; probes hit declared ports on routes served without the API key."""
    from tgi_llm.front.app import _public_router
    from tgi_llm.gateway.http_proxy import HEALTH_ROUTES

    launcher_ports = {args.port, args.http_port, args.grpc_port, args.metrics_port} - {0}
    declared = {p.get("name", str(p["containerPort"])): p["containerPort"] for p in w.container.get("ports", [])}
    problems = [f"container port {n} is not a launcher port" for n in declared.values() if n not in launcher_ports]
    if args.port and args.port not in declared.values():
        problems.append(f"--port {args.port} (the API) is not a container port")
    front_open = {r.path for r in _public_router(None).routes}
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        probe = w.container.get(kind)
        if probe is None:
            problems.append(f"no {kind}")
            continue
        action = probe.get("httpGet") or probe.get("tcpSocket") or probe.get("grpc") or {}
        port = declared.get(action.get("port"), action.get("port"))
        path = probe.get("httpGet", {}).get("path")
        if port not in declared.values():
            problems.append(f"{kind} port {action.get('port')} is not a container port")
        elif path is not None and not (port == args.http_port and HEALTH_ROUTES.match(path)
                                       or port == args.port and path in front_open):
            problems.append(f"{kind} {path} on port {port} is not a health route open without the API key")
    return problems


def _prometheus(w: Workload, args: argparse.Namespace) -> list[str]:
    expected = {"port": str(args.metrics_port), "path": "/metrics"}
    got = {k: w.prometheus.get(k) for k in expected}
    return [] if got == expected else [f"Prometheus annotations {got} != {expected} (the metrics port)"]


def _env(w: Workload) -> list[str]:
    problems = []
    env = {e["name"]: e for e in w.container.get("env", [])}
    threads = env.get("OMP_NUM_THREADS", {}).get("valueFrom", {}).get("resourceFieldRef", {})
    if threads.get("resource") != "limits.cpu" or "cpu" not in w.container.get("resources", {}).get("limits", {}):
        problems.append("OMP_NUM_THREADS does not follow a CPU limit (torch would start a thread per node CPU)")
    ref = env.get("API_KEY", {}).get("valueFrom", {}).get("secretKeyRef", {})
    if not any(s.name == ref.get("name") and ref.get("key") in s.body.get("stringData", {}) for s in w.secrets):
        problems.append(f"API_KEY comes from {ref or 'no Secret'}, which no Secret example provides")
    return problems


def check_image_tag(docs: list[Doc]) -> list[str]:
    """Our image's tag names the NGC Triton release the Dockerfile builds on."""
    version = re.search(r"^ARG TRITON_VERSION=(\S+)$", (ROOT / "Dockerfile").read_text(), re.M).group(1)
    problems = []
    for w in workloads(docs):
        if not w.container["image"].endswith(f"-triton{version}"):
            problems.append(f"{w.label}: image {w.container['image']} is not built on tritonserver {version}")
    return problems


# --- the pool: InferencePool, endpoint picker, Gateway, HPA -------------------------------------------------


def _matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def _flags(args: list[str]) -> dict[str, str]:
    return dict((a[2:].split("=", 1) + [""])[:2] for a in args if a.startswith("--"))


def _container_port(container: dict[str, Any], ref: Any) -> int | None:
    for p in container.get("ports", []):
        if ref in (p.get("name"), p["containerPort"]):
            return p["containerPort"]
    return None


def check_services(docs: list[Doc]) -> list[str]:
    """Each Service selects one Deployment's pods, and each of its ports reaches a port their container declares."""
    problems = []
    for svc in find(docs, "Service"):
        spec = svc.body["spec"]
        pods = [d.body["spec"]["template"] for d in find(docs, "Deployment")
                if _matches(spec["selector"], d.body["spec"]["template"]["metadata"].get("labels", {}))]
        if len(pods) != 1:
            problems.append(f"{svc}: selects {len(pods)} Deployments")
            continue
        for port in spec["ports"]:
            if not any(_container_port(c, port.get("targetPort", port["port"])) for c in pods[0]["spec"]["containers"]):
                problems.append(f"{svc}: port {port['name']} reaches no container port")
    return problems


def check_pool(docs: list[Doc]) -> list[str]:
    problems = []
    for pool in find(docs, "InferencePool"):
        spec = pool.body["spec"]
        selector = spec["selector"]["matchLabels"]
        servers = [w for w in workloads(docs) if _matches(selector, w.pod_labels)]
        for d in find(docs, "Deployment"):
            pod = d.body["spec"]["template"]
            if _matches(selector, pod["metadata"].get("labels", {})) and not any(
                    c.get("args", [None])[0] == LAUNCHER for c in pod["spec"]["containers"]):
                problems.append(f"{pool}: selector {selector} also matches {d}, which is no model server")
        if not servers:
            problems.append(f"{pool}: selector {selector} matches no model server")
        for w in servers:
            args = parsed(w.container)
            if args is not None and [p["number"] for p in spec["targetPorts"]] != [args.port]:
                problems.append(f"{pool}: targetPorts {spec['targetPorts']} != the launcher's --port in {w.label}")
        problems += _picker(docs, pool, servers)
    return problems


def _picker(docs: list[Doc], pool: Doc, servers: list[Workload]) -> list[str]:
    ref = pool.body["spec"]["endpointPickerRef"]
    services = find(docs, "Service", ref["name"])
    if ref.get("kind", "Service") != "Service" or len(services) != 1:
        return [f"{pool}: endpointPickerRef {ref} names no Service"]
    service = services[0].body["spec"]
    ports = [p for p in service["ports"] if p["port"] == ref["port"]["number"]]
    epps = [d for d in find(docs, "Deployment") if _matches(service["selector"], d.body["spec"]["template"]["metadata"]
                                                            ["labels"])]
    if len(ports) != 1 or len(epps) != 1:
        return [f"{pool}: the picker's Service has no port {ref['port']} or selects {len(epps)} Deployments"]
    pod = epps[0].body["spec"]["template"]["spec"]
    epp = pod["containers"][0]
    flags = _flags(epp["args"])
    problems = check_epp_flags(epp["args"])
    if _container_port(epp, ports[0].get("targetPort", ports[0]["port"])) != int(flags.get("grpc-port", 9002)):
        problems.append(f"{pool}: the picker Service's port {ref['port']} does not reach the picker's --grpc-port")
    group = pool.body["apiVersion"].split("/")[0]
    if flags.get("pool-name") != pool.name or flags.get("pool-group", group) != group:
        problems.append(f"{pool}: the picker serves pool {flags.get('pool-name')} ({flags.get('pool-group')})")
    config = _picker_config(docs, pod, flags.get("config-file", ""))
    if config is None:
        return [*problems, f"{pool}: --config-file {flags.get('config-file')} is no key of a mounted ConfigMap"]
    return problems + check_epp_config(config, servers)


def _picker_config(docs: list[Doc], pod: dict[str, Any], path: str) -> Any:
    file = PurePosixPath(path)
    for mount in pod["containers"][0].get("volumeMounts", []):
        if PurePosixPath(mount["mountPath"]) == file.parent:
            for volume in pod.get("volumes", []):
                if volume["name"] == mount["name"] and "configMap" in volume:
                    for cm in find(docs, "ConfigMap", volume["configMap"]["name"]):
                        if file.name in cm.body.get("data", {}):
                            return yaml.load(cm.body["data"][file.name], Loader=LOADER)
    return None


@cache
def _epp_flag_names() -> tuple[frozenset[str], frozenset[str]]:
    known = json.loads(next(SCHEMAS.glob("epp-flags-*.json")).read_text())
    return frozenset(known["flags"]), frozenset(known["rejected"])


def check_epp_flags(args: list[str]) -> list[str]:
    known, rejected = _epp_flag_names()
    problems = [f"the picker has no flag --{f}" for f in _flags(args) if f not in known]
    problems += [f"the picker refuses to start with --{f} (metrics go in engineConfigs)" for f in _flags(args)
                 if f in rejected]
    return problems


def check_epp_config(config: Any, servers: list[Workload]) -> list[str]:
    """The picker's own schema and load-time rules, and its metric mapping against the server's gauges."""
    problems = [f"EndpointPickerConfig: {e.message} at {list(e.absolute_path)}"
                for e in epp_config_validator().iter_errors(config)]
    if problems:
        return problems
    names = [p.get("name") or p["type"] for p in config["plugins"]]
    problems += [f"plugin name {n} is used twice" for n in set(names) if names.count(n) > 1]
    refs = [r["pluginRef"] for prof in config["schedulingProfiles"] for r in prof["plugins"]]
    for source in config.get("dataLayer", {}).get("sources", []):
        refs += [source["pluginRef"], *(e["pluginRef"] for e in source["extractors"])]
    problems += [f"pluginRef {r} names no plugin" for r in refs if r not in names]
    for plugin in config["plugins"]:
        if plugin["type"] == "core-metrics-extractor":
            problems += _engine_mapping(plugin.get("parameters", {}), servers)
    return problems


def _engine_mapping(params: dict[str, Any], servers: list[Workload]) -> list[str]:
    engines = {e["name"]: e for e in params.get("engineConfigs", [])}
    key = params.get("engineLabelKey", "inference.networking.k8s.io/engine-type")
    problems = []
    for w in servers:
        engine = w.pod_labels.get(key, params.get("defaultEngine", "vllm"))
        if engine not in engines:
            problems.append(f"{w.label}: engine {engine!r} ({key}) has no engineConfigs entry")
            continue
        for field, spec in engines[engine].items():
            if field.endswith("Spec") and spec and metric_name(spec) not in exported_gauges():
                problems.append(f"engine {engine}: {field} {spec!r} is not a gauge the server exports")
    return problems


def check_route(docs: list[Doc]) -> list[str]:
    """Every OpenAI POST route of the front reaches an InferencePool through a Gateway."""
    from tgi_llm.front import openai_routes

    problems = []
    for route in find(docs, "HTTPRoute"):
        for parent in route.body["spec"]["parentRefs"]:
            if not find(docs, parent.get("kind", "Gateway"), parent["name"]):
                problems.append(f"{route}: parent {parent['name']} is not declared")
        prefixes = []
        for rule in route.body["spec"]["rules"]:
            if any(b.get("kind") == "InferencePool" and not find(docs, "InferencePool", b["name"])
                   for b in rule["backendRefs"]):
                problems.append(f"{route}: a backendRef names no InferencePool")
            prefixes += [m["path"]["value"].rstrip("/") for m in rule.get("matches", [])
                         if m.get("path", {}).get("type") == "PathPrefix"]
        for r in openai_routes.build_router(None).routes:
            if "POST" in r.methods and not any(r.path == p or r.path.startswith(p + "/") for p in prefixes):
                problems.append(f"{route}: {r.path} is not routed")
    return problems


def check_hpa(docs: list[Doc]) -> list[str]:
    """HPA -> Deployment without its own replicas; each metric -> an adapter rule -> a gauge the server exports."""
    rules = [r for cm in find(docs, "ConfigMap") if "config.yaml" in cm.body.get("data", {})
             for r in yaml.load(cm.body["data"]["config.yaml"], Loader=LOADER).get("rules", [])]
    problems = []
    for hpa in find(docs, "HorizontalPodAutoscaler"):
        target = hpa.body["spec"]["scaleTargetRef"]
        deployments = find(docs, target["kind"], target["name"])
        if not deployments:
            problems.append(f"{hpa}: scales {target['name']}, which is not declared")
        problems += [f"{hpa}: {d} sets replicas, which the HPA owns" for d in deployments
                     if "replicas" in d.body["spec"]]
        for metric in hpa.body["spec"]["metrics"]:
            name = metric.get("pods", {}).get("metric", {}).get("name")
            served = [g for r in rules for g in exported_gauges()
                      if re.fullmatch(r["name"]["matches"], g) and
                      re.sub(r["name"]["matches"], r["name"].get("as", "") or g, g) == name and g in r["seriesQuery"]]
            if metric["type"] != "Pods" or not served:
                problems.append(f"{hpa}: metric {name} is no exported gauge renamed by a prometheus-adapter rule")
    return problems


def check_kserve(docs: list[Doc]) -> list[str]:
    """InferenceService -> its runtime; its storageUri -> the claim and directory the Deployment serves."""
    served_dirs = {a.model_id for w in workloads(docs) if w.pod_labels and (a := parsed(w.container))}
    problems = []
    for isvc in find(docs, "InferenceService"):
        model = isvc.body["spec"]["predictor"]["model"]
        runtimes = find(docs, "ServingRuntime", model["runtime"])
        if not runtimes:
            problems.append(f"{isvc}: runtime {model['runtime']} is not declared")
            continue
        spec = runtimes[0].body["spec"]
        if model["modelFormat"]["name"] not in [f["name"] for f in spec["supportedModelFormats"]]:
            problems.append(f"{isvc}: {runtimes[0]} does not support format {model['modelFormat']['name']}")
        if spec["containers"][0]["name"] != "kserve-container":
            problems.append(f"{runtimes[0]}: KServe serves the container named kserve-container")
        if getattr(parsed(spec["containers"][0]), "model_id", None) != "/mnt/models":
            problems.append(f"{runtimes[0]}: --model-id is not /mnt/models, where KServe mounts storageUri")
        claim, _, subdir = model["storageUri"].removeprefix("pvc://").partition("/")
        if not model["storageUri"].startswith("pvc://") or not find(docs, "PersistentVolumeClaim", claim):
            problems.append(f"{isvc}: storageUri {model['storageUri']} is not a declared claim")
        if served_dirs and not any(str(PurePosixPath(d).name) == subdir for d in served_dirs):
            problems.append(f"{isvc}: serves {subdir}, the Deployment {sorted(served_dirs)}")
    for job in find(docs, "Job"):
        env = {e["name"]: e.get("value") for e in job.body["spec"]["template"]["spec"]["containers"][0]["env"]}
        if env.get("TARGET_DIR") not in served_dirs:
            problems.append(f"{job}: stages {env.get('TARGET_DIR')}, the Deployment serves {sorted(served_dirs)}")
    return problems


def check_kustomizations(docs: list[Doc]) -> list[str]:
    """Every file is applied by some kustomization or stands alone; every patch is used."""
    problems, patches = [], set()
    for k in [d for d in docs if d.kind == "Kustomization"]:
        listed = {(k.path.parent / r).resolve() for r in k.body.get("resources", [])}
        patches |= {(k.path.parent / p["path"]).resolve() for p in k.body.get("patches", [])}
        problems += [f"{k}: {p} does not exist" for p in listed | patches if not p.exists()]
        siblings = {p.resolve() for p in k.path.parent.glob("*.y*ml")} - {k.path.resolve()} - patches
        problems += [f"{k}: {p.name} is in its folder but not in its resources" for p in siblings - listed]
    for d in docs:
        if isinstance(d.body, list) and d.path.resolve() not in patches:
            problems.append(f"{d}: a JSON patch no kustomization uses")
    return problems


def check_secret_placeholders(docs: list[Doc]) -> list[str]:
    """The Secret examples hold placeholders, never a key."""
    return [f"{s}: {k} is not a REPLACE-ME placeholder" for s in find(docs, "Secret")
            for k, v in s.body.get("stringData", {}).items() if not str(v).startswith("REPLACE-ME")]


def all_problems(docs: list[Doc]) -> list[str]:
    problems = [p for w in workloads(docs) for p in check_launcher(w)]
    for check in (check_image_tag, check_services, check_pool, check_route, check_hpa, check_kserve,
                  check_kustomizations, check_secret_placeholders):
        problems += check(docs)
    return problems
