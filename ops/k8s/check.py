#!/usr/bin/env python3
"""Checks the Kubernetes manifests in this folder without a cluster and without network.

- Built-in kinds (Deployment, Service, PodDisruptionBudget, ConfigMap, Secret) are validated
  strictly (unknown fields refused) against the Kubernetes schemas that the PyPI package
  kubernetes-validate carries, for the version named below.
- KEDA's kinds (ScaledObject, TriggerAuthentication) against keda.schema.json beside this file.
- And what no schema sees: selectors that match their pods, references that name something
  that exists (config maps, secrets and their keys, the scaled Deployment, the trigger's
  authentication), the job queue the trigger reads, probes on the paths the binary serves, a
  worker's grace period longer than its drain, and every APTIX_ setting documented (in the
  README or a page of docs/).

Exit status 0 when all holds; each problem is printed.
"""
import json
import pathlib
import sys

import jsonschema
import kubernetes_validate
import yaml

KUBERNETES_VERSION = "1.30.0"
HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent.parent
DOCUMENTED = "\n".join(
    p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
)

problems = []


def problem(where, what):
    problems.append(f"{where}: {what}")


docs = []
for path in sorted(HERE.glob("*.yaml")):
    for doc in yaml.safe_load_all(path.read_text()):
        if doc:
            docs.append((path.name, doc))
if not docs:
    problem("ops/k8s", "no manifests")

keda = json.loads((HERE / "keda.schema.json").read_text())
by_kind = {}
for name, doc in docs:
    kind = doc.get("kind")
    where = f"{name} {kind}/{doc.get('metadata', {}).get('name')}"
    by_kind.setdefault(kind, []).append(doc)
    if doc.get("apiVersion", "").startswith("keda.sh/"):
        schema = dict(keda)
        schema["$ref"] = f"#/$defs/{kind}"
        try:
            jsonschema.validate(doc, schema)
        except jsonschema.ValidationError as e:
            problem(where, f"{e.message} at {list(e.absolute_path)}")
        continue
    try:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as e:
        problem(where, f"{e.message} at {list(e.path)}")
    except kubernetes_validate.utils.SchemaNotFoundError as e:
        problem(where, f"no schema: {e}")


def named(kind, name):
    return next((d for d in by_kind.get(kind, []) if d["metadata"]["name"] == name), None)


def matches(selector, labels):
    return all(labels.get(k) == v for k, v in selector.items())


deployments = by_kind.get("Deployment", [])
for d in deployments:
    where = f"Deployment/{d['metadata']['name']}"
    spec = d["spec"]
    pod = spec["template"]
    if not matches(spec["selector"]["matchLabels"], pod["metadata"].get("labels", {})):
        problem(where, "its selector does not match its pods")
    for c in pod["spec"]["containers"]:
        for source in c.get("envFrom", []):
            for kind, key in (("ConfigMap", "configMapRef"), ("Secret", "secretRef")):
                if key in source and not named(kind, source[key]["name"]):
                    problem(where, f"{kind} {source[key]['name']} does not exist")
        for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
            got = c.get(probe, {}).get("httpGet", {}).get("path")
            if got != path:
                problem(where, f"{probe} asks {got}, not {path}")
        args = c.get("args", [])
        if not args or args[0] not in ("serve", "worker"):
            problem(where, f"runs {args}, not aptix serve or aptix worker")
        if args and args[0] == "worker":
            grace = pod["spec"].get("terminationGracePeriodSeconds", 30)
            drain = next(int(m["data"]["APTIX_SHUTDOWN_GRACE_SECS"]) for m in by_kind["ConfigMap"] if "APTIX_SHUTDOWN_GRACE_SECS" in m["data"])
            if grace <= drain:
                problem(where, f"grace period {grace}s is not longer than the {drain}s drain")

for kind in ("Service", "PodDisruptionBudget"):
    for s in by_kind.get(kind, []):
        selector = s["spec"]["selector"]
        selector = selector.get("matchLabels", selector)
        if not any(matches(selector, d["spec"]["template"]["metadata"]["labels"]) for d in deployments):
            problem(f"{kind}/{s['metadata']['name']}", "selects no pods")

for so in by_kind.get("ScaledObject", []):
    where = f"ScaledObject/{so['metadata']['name']}"
    if not named("Deployment", so["spec"]["scaleTargetRef"]["name"]):
        problem(where, "scales a Deployment that does not exist")
    for t in so["spec"]["triggers"]:
        auth = t.get("authenticationRef", {}).get("name")
        ta = named("TriggerAuthentication", auth) if auth else None
        if auth and not ta:
            problem(where, f"TriggerAuthentication {auth} does not exist")
        if t["type"] == "rabbitmq":
            ns = next((m["data"].get("APTIX_NAMESPACE") for m in by_kind["ConfigMap"]), "aptix")
            if t["metadata"]["queueName"] != f"{ns}.turns":
                problem(where, f"reads {t['metadata']['queueName']}, not the job queue {ns}.turns")
        for ref in (ta or {}).get("spec", {}).get("secretTargetRef", []):
            secret = named("Secret", ref["name"])
            if not secret or ref["key"] not in secret.get("stringData", secret.get("data", {})):
                problem(where, f"secret {ref['name']} has no key {ref['key']}")

for kind in ("ConfigMap", "Secret"):
    for m in by_kind.get(kind, []):
        for key in m.get("data", m.get("stringData", {})):
            if key.startswith("APTIX_") and f"`{key}`" not in DOCUMENTED:
                problem(f"{kind}/{m['metadata']['name']}", f"{key} is not a setting the docs document")

for p in problems:
    print(p)
print(f"ops/k8s: {len(docs)} manifests, {len(problems)} problem(s)")
sys.exit(1 if problems else 0)
