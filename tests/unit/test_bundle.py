"""The OLM bundle is the chart (issue 46, 4): operator/scripts/bundle.py, checked against the
chart it renders (helm). The operator framework's validators and the real CSV schema judge it
in tests/integration/test_olm_bundle.py."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.scripts import script

from .test_chart_lint import CHART, helm, needs_helm, operator_container

ROOT = Path(__file__).resolve().parents[2]
bundle = script("bundle")

pytestmark = needs_helm

OPERATOR = "registry.example/spyre/spyre-model-operator@sha256:" + "a" * 64
ENGINE = "registry.example/spyre/spyre-engine@sha256:" + "b" * 64


@pytest.fixture(scope="module")
def files() -> dict[str, Any]:
    return bundle.build_bundle(CHART, OPERATOR, ENGINE, created="2026-12-07T00:00:00Z")


def _csv(files: dict[str, Any]) -> dict[str, Any]:
    return files["manifests/spyre-model-operator.clusterserviceversion.yaml"]  # type: ignore[no-any-return]


def test_the_csv_installs_what_the_chart_installs(files: dict[str, Any]) -> None:
    out = helm("template", "spyre-model-operator", str(CHART), "--namespace", "spyre-system").stdout
    chart = [d for d in yaml.safe_load_all(out) if d]
    csv = _csv(files)
    strategy = csv["spec"]["install"]["spec"]
    (dep,) = strategy["deployments"]
    container = dep["spec"]["template"]["spec"]["containers"][0]
    want = [a for a in operator_container(chart)["args"]
            if not a.startswith("--leader-election-namespace=")]  # fmt: skip
    assert container["args"] == [*want, f"--default-engine-image={ENGINE}"]
    assert container["image"] == OPERATOR
    # the operator's rights: the chart's ClusterRoles for it (workloads, leases, reviews)
    own = [r for d in chart if d["kind"] == "ClusterRole"
           and not d["metadata"]["name"].endswith(("-metrics-reader", "-view", "-edit"))
           for r in d["rules"]]  # fmt: skip
    (cluster,) = strategy["clusterPermissions"]
    assert cluster["rules"] == own and cluster["serviceAccountName"] == "spyre-model-operator"
    (election,) = strategy["permissions"]
    assert {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
            "verbs": ["create"]} in election["rules"]  # fmt: skip
    # OLM runs it in the namespace it chooses: nothing names the render's
    text = yaml.safe_dump(files)
    assert bundle.PLACEHOLDER not in text and "spyre-system-" not in text


def test_the_csv_says_what_operatorhub_reads(files: dict[str, Any]) -> None:
    csv = _csv(files)
    meta, spec = csv["metadata"], csv["spec"]
    assert {m["type"]: m["supported"] for m in spec["installModes"]} == {
        "OwnNamespace": False, "SingleNamespace": False, "MultiNamespace": False,
        "AllNamespaces": True}  # fmt: skip
    assert spec["relatedImages"] == [{"name": "spyre-model-operator", "image": OPERATOR},
                                     {"name": "spyre-engine", "image": ENGINE}]  # fmt: skip
    assert all("@sha256:" in r["image"] for r in spec["relatedImages"])
    assert meta["annotations"]["containerImage"] == OPERATOR
    assert meta["name"] == f"spyre-model-operator.v{spec['version']}"
    for k, v in bundle.FEATURES.items():
        assert meta["annotations"][k] == v
    (example,) = json.loads(meta["annotations"]["alm-examples"])
    assert example["kind"] == "SpyreModel" and "precompile" not in example["spec"]
    (owned,) = spec["customresourcedefinitions"]["owned"]
    assert (owned["name"], owned["version"], owned["kind"]) == (
        "spyremodels.serving.spyre.dev", "v1alpha1", "SpyreModel")
    paths = {d["path"] for d in owned["specDescriptors"]}
    assert {"model", "compile", "replicas", "serving", "cache"} <= paths
    assert {d["path"] for d in owned["statusDescriptors"]} >= {"conditions", "endpoint"}
    assert all(d["description"] for d in owned["specDescriptors"])


def test_the_bundle_metadata_and_extra_manifests(files: dict[str, Any]) -> None:
    ann = files["metadata/annotations.yaml"]["annotations"]
    assert ann["operators.operatorframework.io.bundle.mediatype.v1"] == "registry+v1"
    assert ann["operators.operatorframework.io.bundle.package.v1"] == "spyre-model-operator"
    roles = {k for k in files if k.endswith(".clusterrole.yaml")}
    assert roles == {f"manifests/spyre-model-operator-{n}.clusterrole.yaml"
                     for n in ("metrics-reader", "spyremodels-view", "spyremodels-edit")}
    crd = files["manifests/spyremodels.serving.spyre.dev.crd.yaml"]
    assert crd == yaml.safe_load((ROOT / "crds" / "serving.spyre.dev_spyremodels.yaml").read_text())
    dockerfile = files["bundle.Dockerfile"]
    assert dockerfile.startswith("FROM scratch\n") and "COPY manifests /manifests/" in dockerfile


def test_the_catalog_names_the_bundle_by_digest_with_its_own_manifests(
    files: dict[str, Any],
) -> None:
    """Issue 46, 4: the file-based catalog ``make release`` pushes (as ``opm render`` would
    write it): one package, its channel with the bundle as the one entry, the bundle by
    digest with its version, the API it provides, its manifests and every image it pulls."""
    image = "registry.example/spyre/spyre-model-operator-bundle@sha256:" + "c" * 64
    out = bundle.catalog(files, image)
    package, channel, entry = out["catalog/spyre-model-operator/catalog.json"]
    csv = _csv(files)
    assert package == {"schema": "olm.package", "name": "spyre-model-operator",
                       "defaultChannel": "candidate", "icon": csv["spec"]["icon"][0],
                       "description": csv["metadata"]["annotations"]["description"]}
    assert channel["package"] == entry["package"] == package["name"]
    assert channel["name"] == package["defaultChannel"]
    assert channel["entries"] == [{"name": csv["metadata"]["name"]}] and entry["name"] == (
        csv["metadata"]["name"])
    assert entry["image"] == image
    props = entry["properties"]
    assert {"type": "olm.package", "value": {"packageName": "spyre-model-operator",
                                             "version": csv["spec"]["version"]}} in props
    assert {"type": "olm.gvk", "value": {"group": "serving.spyre.dev", "kind": "SpyreModel",
                                         "version": "v1alpha1"}} in props
    objects = [json.loads(base64.b64decode(p["value"]["data"]))
               for p in props if p["type"] == "olm.bundle.object"]
    assert objects == [files[k] for k in sorted(files) if k.startswith("manifests/")]
    assert [i["image"] for i in entry["relatedImages"]] == [image, OPERATOR, ENGINE]


def test_the_catalog_image_is_served_by_opm_or_holds_its_files_only() -> None:
    """On opm's image the catalog's cache is built at build time and opm serves it; on
    scratch (the tests: opm is not served here) only the files and the label OLM reads."""
    served = bundle.catalog_dockerfile(bundle.CATALOG_BASE)
    assert served.startswith(f"FROM {bundle.CATALOG_BASE}\n")
    assert '"--cache-only"' in served and 'ENTRYPOINT ["/bin/opm"]' in served
    bare = bundle.catalog_dockerfile("scratch")
    assert "RUN" not in bare and "ENTRYPOINT" not in bare
    for text in (served, bare):
        assert "COPY catalog /configs\n" in text
        assert text.endswith("LABEL operators.operatorframework.io.index.configs.v1=/configs\n")


def test_a_written_catalog_is_one_json_blob_after_the_other(
    files: dict[str, Any], tmp_path: Path
) -> None:
    out = bundle.catalog(files, "r.example/b@sha256:" + "d" * 64, "scratch")
    assert out["catalog.Dockerfile"] == bundle.catalog_dockerfile("scratch")
    bundle.write_bundle(out, tmp_path)
    text = (tmp_path / "catalog/spyre-model-operator/catalog.json").read_text()
    blobs = bundle.read_catalog(text)
    assert len(blobs) == 3 and text.count('\n{\n  "schema"') == 2  # three objects, not a list
    assert blobs == out["catalog/spyre-model-operator/catalog.json"]
    assert (tmp_path / "catalog.Dockerfile").read_text() == out["catalog.Dockerfile"]
