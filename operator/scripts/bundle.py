#!/usr/bin/env python3
"""``make bundle``: the operator as an OLM bundle (registry+v1) for OperatorHub, generated from
the Helm chart so the two never say different things (issue 46, 4).

    bundle.py --out bundle/ [--operator-image REF] [--engine-image REF] [--chart DIR]

The chart is rendered with its defaults for the cluster scope (``watch.allNamespaces``, OLM's
``AllNamespaces`` install mode) and turned into:

- ``manifests/spyre-model-operator.clusterserviceversion.yaml``: the chart's Deployment as the
  install strategy (its arguments but ``--leader-election-namespace``: the operator takes its
  own namespace, ``POD_NAMESPACE``, as the chart sets it), the operator's ClusterRole rules
  (workloads, leases, the /metrics reviews) as ``clusterPermissions``, the leader-election
  Role as ``permissions``; the SpyreModel CRD as owned, with spec and status descriptors from
  its schema; ``relatedImages`` (the operator and the default engine image: pass them by
  digest, as ``make release`` pins the chart); ``alm-examples`` from operator/samples; the
  ``features.operators.openshift.io`` annotations;
- ``manifests/`` also holds the CRD, and the ClusterRoles for people and scrapers (SpyreModel
  view/edit aggregated into the built-in roles, the metrics reader);
- ``metadata/annotations.yaml`` and ``bundle.Dockerfile`` (package, channel ``candidate``).

Not in the bundle, because OLM installs no such kinds: the chart's ValidatingAdmissionPolicies
(``rbac.confineWrites``: apply them from the chart with ``helm template --show-only``) and its
NetworkPolicy. tests/integration/test_olm_bundle.py validates the result with the operator
framework's own validators and applies the CSV to the API server with the real CSV schema.
"""

from __future__ import annotations

import argparse
import base64
import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART_DIR = ROOT / "charts" / "spyre-model-operator"
PACKAGE = "spyre-model-operator"
#: OLM's recommended channel names are candidate, fast and stable: a v1alpha1 API is a candidate.
CHANNEL = "candidate"
#: A namespace no rendered object may keep: OLM decides where the operator runs.
PLACEHOLDER = "olm-placeholder-namespace"
RELEASE = PACKAGE
CRD_NAME = "spyremodels.serving.spyre.dev"
#: What OpenShift's console and the OperatorHub validator read (all but disconnected: no).
FEATURES = {
    "features.operators.openshift.io/disconnected": "true",
    "features.operators.openshift.io/fips-compliant": "false",
    "features.operators.openshift.io/proxy-aware": "true",
    "features.operators.openshift.io/tls-profiles": "false",
    "features.operators.openshift.io/token-auth-aws": "false",
    "features.operators.openshift.io/token-auth-azure": "false",
    "features.operators.openshift.io/token-auth-gcp": "false",
    "features.operators.openshift.io/cnf": "false",
    "features.operators.openshift.io/cni": "false",
    "features.operators.openshift.io/csi": "false",
}
ICON = ('<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 64 64"><rect width="64" '
        'height="64" rx="12" fill="#0f62fe"/><path d="M16 44 L32 14 L48 44 Z" fill="none" '
        'stroke="#fff" stroke-width="5"/></svg>')
#: Spec fields whose OpenShift console widget is known (x-descriptors).
SPEC_WIDGETS = {"replicas": ["urn:alm:descriptor:com.tectonic.ui:podCount"]}
STATUS_FIELDS = {
    "conditions": ("Conditions", ["urn:alm:descriptor:io.kubernetes.conditions"]),
    "endpoint": ("Endpoint", ["urn:alm:descriptor:org.w3:link"]),
    "readyReplicas": ("Ready replicas", ["urn:alm:descriptor:com.tectonic.ui:podCount"]),
    "servingArtifactKey": ("Serving artifact", ["urn:alm:descriptor:text"]),
}


def builtin_engine() -> str:
    """The engine image the operator uses when the chart names none."""
    sys.path.insert(0, str(ROOT / "operator"))
    from spyre_operator.desired.site import BUILTIN_ENGINE_IMAGE

    return str(BUILTIN_ENGINE_IMAGE)


def _release() -> Any:
    """release.py, beside this script: its helm lookup and the project's version."""
    sys.path.insert(0, str(ROOT / "operator" / "scripts"))
    import release

    return release


def helm_bin() -> str:
    return str(_release().helm_bin())


def render(chart: Path) -> list[dict[str, Any]]:
    """The chart's objects for the cluster scope, in the placeholder namespace."""
    out = subprocess.run(
        [helm_bin(), "template", RELEASE, str(chart), "--namespace", PLACEHOLDER,
         "--set", "watch.allNamespaces=true", "--set", "networkPolicy.enabled=false"],
        check=True, capture_output=True, text=True).stdout  # fmt: skip
    return [d for d in yaml.safe_load_all(out) if d]


def _one(docs: list[dict[str, Any]], kind: str, suffix: str = "") -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"].endswith(suffix)]
    if len(found) != 1:
        raise SystemExit(f"the chart rendered {len(found)} {kind} named *{suffix}, not one")
    return found[0]


def _title(field: str) -> str:
    words = "".join(f" {c.lower()}" if c.isupper() else c for c in field).strip()
    return words[:1].upper() + words[1:]


def descriptors(crd: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Spec descriptors for every top-level spec field, status descriptors for the fields the
    console shows, each with the schema's description."""
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
    spec = [{"path": f, "displayName": _title(f),
             "description": " ".join(str(p.get("description", "")).split())[:500],
             **({"x-descriptors": SPEC_WIDGETS[f]} if f in SPEC_WIDGETS else {})}
            for f, p in sorted(schema["spec"]["properties"].items())]  # fmt: skip
    status_props = schema["status"]["properties"]
    status = [{"path": f, "displayName": name,
               "description": " ".join(str(status_props[f].get("description", "")).split())[:500],
               "x-descriptors": widgets}
              for f, (name, widgets) in STATUS_FIELDS.items() if f in status_props]  # fmt: skip
    return spec, status


def _examples() -> list[dict[str, Any]]:
    sample = yaml.safe_load((ROOT / "operator" / "samples" / "granite-generate.yaml").read_text())
    sample["spec"].pop("precompile", None)  # the kwok demo's annotations
    return [sample]


def _cluster_unique(doc: dict[str, Any]) -> dict[str, Any]:
    """A cluster-scoped object of the chart, named without the release namespace."""
    out = copy.deepcopy(doc)
    out["metadata"]["name"] = out["metadata"]["name"].removeprefix(f"{PLACEHOLDER}-")
    out["metadata"].pop("namespace", None)
    return out


def build_bundle(chart: Path = CHART_DIR, operator_image: str | None = None,
                 engine_image: str | None = None, version: str | None = None,
                 created: str = "") -> dict[str, Any]:
    """The bundle's files: relative path -> object (YAML) or text."""
    version = version or str(_release().project_version())
    docs = render(chart)
    crd = _one(docs, "CustomResourceDefinition")
    crd["metadata"].pop("annotations", None)  # helm's keep policy means nothing to OLM
    dep = copy.deepcopy(_one(docs, "Deployment"))
    pod = dep["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    container["args"] = [a for a in container["args"]
                         if not a.startswith("--leader-election-namespace=")]
    if operator_image:
        container["image"] = operator_image
    if engine_image:
        container["args"] = [a for a in container["args"]
                             if not a.startswith("--default-engine-image=")]
        container["args"].append(f"--default-engine-image={engine_image}")
    engine = next((a.split("=", 1)[1] for a in container["args"]
                   if a.startswith("--default-engine-image=")), None) or builtin_engine()
    sa = pod.pop("serviceAccountName")
    pod.pop("serviceAccount", None)
    cluster_roles = [d for d in docs if d["kind"] == "ClusterRole"]
    own = [r for r in cluster_roles
           if not r["metadata"]["name"].endswith(("-metrics-reader", "-view", "-edit"))]
    others = [r for r in cluster_roles if r not in own]
    election = _one(docs, "Role", "-leader-election")
    csv_name = f"{PACKAGE}.v{version}"
    spec_desc, status_desc = descriptors(crd)
    related = [{"name": "spyre-model-operator", "image": container["image"]},
               {"name": "spyre-engine", "image": engine}]
    csv = {
        "apiVersion": "operators.coreos.com/v1alpha1",
        "kind": "ClusterServiceVersion",
        "metadata": {
            "name": csv_name,
            "annotations": {
                "alm-examples": json.dumps(_examples()),
                "capabilities": "Seamless Upgrades",
                "categories": "AI/Machine Learning",
                "containerImage": container["image"],
                "createdAt": created,
                "description": "Serves large language models on IBM Spyre accelerators with "
                               "vLLM: compile once into a shared cache, serve read-only.",
                "operatorframework.io/suggested-namespace": "spyre-system",
                "operators.operatorframework.io/builder": "spyre-model-operator bundle.py",
                "repository": "https://github.com/spyre-model-operator/spyre-model-operator",
                "support": "spyre-model-operator",
                **FEATURES,
            },
        },
        "spec": {
            "displayName": "Spyre Model Operator",
            "description": (ROOT / "operator" / "OLM-DESCRIPTION.md").read_text(),
            "version": version,
            "maturity": "alpha",
            "minKubeVersion": "1.30.0",
            "provider": {"name": "spyre-model-operator"},
            "maintainers": [{"name": "spyre-model-operator",
                             "email": "maintainers@spyre-model-operator.invalid"}],
            "links": [{"name": "Documentation", "url":
                       "https://github.com/spyre-model-operator/spyre-model-operator"}],
            "keywords": ["spyre", "vllm", "llm", "inference", "ibm", "accelerator"],
            "icon": [{"base64data": base64.b64encode(ICON.encode()).decode(),
                      "mediatype": "image/svg+xml"}],
            "installModes": [
                {"type": "OwnNamespace", "supported": False},
                {"type": "SingleNamespace", "supported": False},
                {"type": "MultiNamespace", "supported": False},
                {"type": "AllNamespaces", "supported": True},
            ],
            "install": {"strategy": "deployment", "spec": {
                "deployments": [{"name": dep["metadata"]["name"],
                                 "label": dep["metadata"].get("labels") or {},
                                 "spec": dep["spec"]}],
                "clusterPermissions": [{"serviceAccountName": sa,
                                        "rules": [r for c in own for r in c["rules"]]}],
                "permissions": [{"serviceAccountName": sa, "rules": election["rules"]}],
            }},
            "customresourcedefinitions": {"owned": [{
                "name": CRD_NAME, "version": "v1alpha1", "kind": "SpyreModel",
                "displayName": "Spyre model",
                "description": "A model compiled for Spyre cards and served with vLLM.",
                "resources": [{"kind": k, "name": "", "version": v} for k, v in (
                    ("Deployment", "v1"), ("Job", "v1"), ("Service", "v1"),
                    ("PersistentVolumeClaim", "v1"), ("ConfigMap", "v1"))],
                "specDescriptors": spec_desc, "statusDescriptors": status_desc,
            }]},
            "relatedImages": related,
        },
    }
    text = yaml.safe_dump(csv, sort_keys=False)
    if PLACEHOLDER in text:
        raise SystemExit(f"the CSV names the render's namespace ({PLACEHOLDER}): "
                         + next(ln for ln in text.splitlines() if PLACEHOLDER in ln))
    annotations = {
        "operators.operatorframework.io.bundle.mediatype.v1": "registry+v1",
        "operators.operatorframework.io.bundle.manifests.v1": "manifests/",
        "operators.operatorframework.io.bundle.metadata.v1": "metadata/",
        "operators.operatorframework.io.bundle.package.v1": PACKAGE,
        "operators.operatorframework.io.bundle.channels.v1": CHANNEL,
        "operators.operatorframework.io.bundle.channel.default.v1": CHANNEL,
    }
    files: dict[str, Any] = {
        f"manifests/{PACKAGE}.clusterserviceversion.yaml": csv,
        f"manifests/{CRD_NAME}.crd.yaml": crd,
        "metadata/annotations.yaml": {"annotations": annotations},
        "bundle.Dockerfile": "FROM scratch\n" + "".join(
            f"LABEL {k}={v}\n" for k, v in annotations.items())
        + "COPY manifests /manifests/\nCOPY metadata /metadata/\n",
    }
    for role in others:
        r = _cluster_unique(role)
        files[f"manifests/{r['metadata']['name']}.clusterrole.yaml"] = r
    return files


#: The base of the catalog image: operator-framework's opm, which serves the catalog to OLM.
CATALOG_BASE = "quay.io/operator-framework/opm:v1.54.0"
#: Where the catalog image keeps its file-based catalog (the label OLM reads names it).
CONFIGS = "/configs"


def catalog(files: dict[str, Any], bundle_image: str, base: str = CATALOG_BASE
            ) -> dict[str, Any]:  # fmt: skip
    """The file-based catalog of this one bundle (``files``, from :func:`build_bundle`, whose
    image is ``bundle_image``, by digest), as ``opm render`` and ``opm init`` write it: the
    package (channel ``candidate``, its icon and description), the channel with the bundle as
    its one entry, and the bundle (its package and version, the API it provides, its
    manifests as ``olm.bundle.object``, its related images and its own), and the image's
    Containerfile on ``base``. Returns ``{"catalog/spyre-model-operator/catalog.json":
    [blobs], "catalog.Dockerfile": text}``."""
    csv = files[f"manifests/{PACKAGE}.clusterserviceversion.yaml"]
    spec = csv["spec"]
    objects = [files[k] for k in sorted(files) if k.startswith("manifests/")]
    owned = spec["customresourcedefinitions"]["owned"]
    group = CRD_NAME.split(".", 1)[1]
    package = {"schema": "olm.package", "name": PACKAGE, "defaultChannel": CHANNEL,
               "icon": spec["icon"][0],
               "description": csv["metadata"]["annotations"]["description"]}
    channel = {"schema": "olm.channel", "package": PACKAGE, "name": CHANNEL,
               "entries": [{"name": csv["metadata"]["name"]}]}
    bundle = {
        "schema": "olm.bundle", "name": csv["metadata"]["name"], "package": PACKAGE,
        "image": bundle_image,
        "properties": [
            {"type": "olm.package", "value": {"packageName": PACKAGE,
                                              "version": spec["version"]}},
            *({"type": "olm.gvk", "value": {"group": group, "kind": o["kind"],
                                            "version": o["version"]}} for o in owned),
            *({"type": "olm.bundle.object", "value": {"data": base64.b64encode(
                json.dumps(o, sort_keys=True).encode()).decode()}} for o in objects),
        ],
        "relatedImages": [{"name": "", "image": bundle_image}, *spec["relatedImages"]],
    }
    return {
        f"catalog/{PACKAGE}/catalog.json": [package, channel, bundle],
        "catalog.Dockerfile": catalog_dockerfile(base),
    }


def catalog_dockerfile(base: str) -> str:
    """The catalog image on ``base`` (opm: it serves ``/configs`` to OLM, its cache built at
    build time; ``scratch``: the catalog's files and label only, which no CatalogSource can
    serve: what the tests build, opm being neither served nor runnable here)."""
    text = f"FROM {base}\nCOPY catalog {CONFIGS}\n"
    if base != "scratch":
        text += (f'RUN ["/bin/opm", "serve", "{CONFIGS}", "--cache-dir=/tmp/cache", '
                 '"--cache-only"]\n'
                 'ENTRYPOINT ["/bin/opm"]\n'
                 f'CMD ["serve", "{CONFIGS}", "--cache-dir=/tmp/cache"]\n')
    return text + f"LABEL operators.operatorframework.io.index.configs.v1={CONFIGS}\n"


def read_catalog(text: str) -> list[dict[str, Any]]:
    """The blobs of a file-based catalog's JSON file (one object after the other), as
    :func:`write_bundle` writes them."""
    decoder, blobs, i = json.JSONDecoder(), [], 0
    while i < len(text):
        if text[i].isspace():
            i += 1
            continue
        blob, i = decoder.raw_decode(text, i)
        blobs.append(blob)
    return blobs


def write_bundle(files: dict[str, Any], out: Path) -> None:
    for rel, content in files.items():
        path = out / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, str):
            path.write_text(content)
        elif path.suffix == ".json":  # a file-based catalog: one JSON blob after the other
            path.write_text("".join(json.dumps(b, indent=2) + "\n" for b in content))
        else:
            path.write_text(yaml.safe_dump(content, sort_keys=False))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="the bundle's directory")
    p.add_argument("--chart", type=Path, default=CHART_DIR)
    p.add_argument("--operator-image", help="the operator image (by digest for a release)")
    p.add_argument("--engine-image", help="the default engine image (by digest)")
    p.add_argument("--version", help="default: pyproject.toml's")
    p.add_argument("--created", default="", help="createdAt (RFC 3339; default empty)")
    args = p.parse_args(argv)
    files = build_bundle(args.chart, args.operator_image, args.engine_image, args.version,
                         args.created)
    write_bundle(files, args.out)
    print(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
