"""The operator installed by the Helm chart runs in a real pod on the real node (issue 10, part 4;
issue 28: OpenShift's restricted-v2; issue 29: installed from a release).

Everything is real: the operator image built here (tests/images), installed by the chart with
its RBAC and its restricted pod (read-only root), on the real node; it reconciles a tiny-model
SpyreModel (CPU backend ``eager``, TP 1) whose precompile Job and serving pod run the engine
image there too, and the model answers through its Service.

The first test installs from a release, as a site without internet would: ``make release``
(operator/scripts/release.py) pushed both images and the chart, pinned to their digests, to
the cluster's OCI registry (CNCF distribution on loopback), ``make mirror`` copied it into the
site's path of that registry; the chart is installed from the mirror's ``oci://`` and the
node's containerd pulls every image from there (nothing imported under those names).
The model names no engine image: the released chart's ``defaults.engineImage`` is the one.
The release holds the host's operator image only (the one the node runs): the other
architectures' are tests/integration/test_release_platforms.py's (``make test-platforms``).

The first test runs where OpenShift's default restricted-v2 SCC rules, emulated with
Kubernetes' own admission policies (tests/cluster/manifests/restricted-v2.yaml): the chart's
``podUser: assigned``, both namespaces with uid and group ranges, every pod assigned its uid and
fsGroup by admission and refused had it pinned one outside them. The operator pod then runs as
an arbitrary uid without a passwd entry, as on OpenShift: failure 1 of issue 10 (kopf's
``getpass.getuser()`` raised ``KeyError: 'getpwuid(): uid not found'``) is covered there. The
second test is plain Kubernetes (``podUser: fixed``, uid 65532, which has a passwd entry).

The package's host operator (``operator`` fixture) is stopped for this module
(``no_host_operator``): the chart's pod is the only operator, so its RBAC is what wrote every
child. The test checks that the pod holds its Lease, wrote to the model's namespace itself (its
own /metrics: ``spyre_operator_namespace_writes_total``) and logged no ``Forbidden``.
"""

from __future__ import annotations

import base64
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from spyre_operator.desired.pod import CACHE_VOLUME

from tests.cluster.controlplane import ControlPlane, wait_until
from tests.cluster.node import NODE_NAME, RealNode
from tests.images import build
from tests.operator_log import refusals
from tests.realpods import support as s
from tests.scripts import script
from tests.unit.test_bundle import bundle as bundle_script

from .conftest import assert_no_host_operator

release_script = script("release")

pytestmark = [pytest.mark.integration, pytest.mark.realpods, pytest.mark.slow,
              pytest.mark.usefixtures("no_host_operator"),
              # Cold: the engine image build (~10 min) + import (~3 min) + a compile and a
              # vLLM start on 2 shared cores. Warm: ~3-5 min.
              pytest.mark.timeout(3600)]

MODEL = "tiny"


@pytest.fixture(scope="module")
def images(real_node: RealNode) -> dict[str, str]:
    """Both images built (or reused) and imported into the real node."""
    return s.ensure_images(real_node)


@pytest.fixture(scope="module")
def release(control_plane: ControlPlane, released: dict[str, Any], real_node: RealNode,
            tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The session's release (conftest ``released``) mirrored into ``<registry>/site`` as a
    site without internet would (``make mirror``), with the real node up to pull it."""
    real_node.ensure_base_images()
    mirror = s.mirror_release(control_plane, released, f"{control_plane.registry}/site",
                              tmp_path_factory.mktemp("mirror"))
    # The same images, digests kept: only the repositories differ.
    for key in ("operator", "engine", "bundle", "catalog"):
        assert mirror[key].split("@")[1] == released[key].split("@")[1], (mirror, released)
        assert mirror[key].startswith(f"{control_plane.registry}/site/"), mirror
    assert mirror["operator_platforms"] == released["operator_platforms"], mirror
    assert mirror["engine_platforms"] == released["engine_platforms"], mirror
    return mirror


def _release_namespace(cp: ControlPlane, name: str, restricted_v2: bool) -> Iterator[str]:
    s.ensure_namespace(cp, name, restricted_v2=restricted_v2)
    yield name
    s.uninstall_operator(cp, name, wait=False)
    cp.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)


@pytest.fixture
def operator_namespace(control_plane: ControlPlane, namespace: str) -> Iterator[str]:
    """A namespace for the release (PodSecurity restricted and emulated restricted-v2),
    removed with the release."""
    yield from _release_namespace(control_plane, f"{namespace[:50]}-op", restricted_v2=True)


@pytest.fixture
def plain_operator_namespace(control_plane: ControlPlane, namespace: str) -> Iterator[str]:
    """A namespace for the release (PodSecurity restricted only), removed with the release."""
    yield from _release_namespace(control_plane, f"{namespace[:50]}-op", restricted_v2=False)


def _pod_metrics(cp: ControlPlane, namespace: str, pod: dict[str, Any]) -> dict[str, float]:
    """The operator pod's own /metrics (port `metrics`), fetched from the client pod: refused
    without a token, answered to one the release's metrics-reader ClusterRole lets read it
    (``operator.metricsAuth``: the pod asks the API server with the chart's RBAC)."""
    port = next(p["containerPort"] for p in pod["spec"]["containers"][0]["ports"]
                if p["name"] == "metrics")
    url = f"http://{pod['status']['podIP']}:{port}/metrics"
    op_ns = pod["metadata"]["namespace"]
    res = s.http(cp, namespace, url, timeout=30)
    assert res.status == 401, (res.status, res.text[:500])
    token = s.bind_metrics_reader(cp, op_ns)
    try:
        res = s.http(cp, namespace, url, timeout=30, headers={"Authorization": f"Bearer {token}"})
    finally:
        s.unbind_metrics_reader(cp, op_ns)
    assert res.status == 200, (res.status, res.text[:500])
    return s.parse_metrics(res.text)


def _pulled(pod: dict[str, Any], image: str) -> None:
    """Every container of ``pod`` runs ``image`` (repository@digest), pulled by the node from
    the registry: the kubelet reports that repository's digest as the image's ID."""
    repo, digest = image.split("@", 1)
    for c in pod["spec"]["containers"]:
        assert c["image"] == image, (pod["metadata"]["name"], c["image"])
    for st in pod["status"]["containerStatuses"]:
        assert st["imageID"] in (image, f"{repo}@{digest}"), (pod["metadata"]["name"], st)


def _check_operator_pod(cp: ControlPlane, ns: str, pod: dict[str, Any], uid: int,
                        image: str = "localhost/spyre-model-operator:") -> None:
    assert pod["spec"]["nodeName"] == NODE_NAME
    assert pod["spec"]["securityContext"]["runAsUser"] == uid
    c = pod["spec"]["containers"][0]
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["image"].startswith(image), c["image"]
    st = pod["status"]["containerStatuses"][0]
    assert st["restartCount"] == 0, s.operator_diagnostics(cp, ns)
    log = s.operator_logs(cp, ns)
    assert "getpwuid" not in log and "Traceback" not in log, log[-3000:]
    # The pod, not some other operator, holds the release's Lease.
    name = pod["metadata"]["name"]
    try:
        wait_until(lambda: cp.kubectl_json("get", "lease", s.RELEASE, "-n", ns)["spec"]
                   .get("holderIdentity") == name, 60, f"{name} holding the Lease", 1)
    except TimeoutError as e:
        raise AssertionError(f"{e}\n{s.operator_diagnostics(cp, ns)}") from None
    assert_no_host_operator()


def test_chart_operator_pod_reconciles_a_real_model(
    control_plane: ControlPlane, release: dict[str, Any], namespace: str,
    operator_namespace: str,
) -> None:
    cp, ns, op_ns = control_plane, namespace, operator_namespace
    s.ensure_namespace(cp, ns, labels={"spyre.dev/test-namespace": "true"})
    # The released chart, from the registry, with its pinned images (no image values).
    pod = s.install_operator(cp, op_ns, None, chart=release["chart"],
                             chart_flags=["--version", release["version"], "--plain-http"],
                             watch_namespaces=[ns], timeout=600)
    _pulled(pod, release["operator"])
    # The chart set no uid: admission assigned the first of the namespace's range, for which
    # the image has no passwd entry (as on OpenShift), and the pod runs.
    template = cp.kubectl_json("get", "deployment", s.RELEASE, "-n", op_ns)["spec"]["template"]
    assert "runAsUser" not in template["spec"]["securityContext"], "the chart pinned a uid"
    assert "--pod-user=assigned" in template["spec"]["containers"][0]["args"]
    op_uid = s.scc_range_start(op_ns)
    _check_operator_pod(cp, op_ns, pod, op_uid, release["operator"])
    r = cp.kubectl("exec", "-n", op_ns, pod["metadata"]["name"], "--", "python", "-c",
                   "import getpass; getpass.getuser()", check=False)
    assert r.returncode != 0 and f"uid not found: {op_uid}" in r.stderr, (r.stdout, r.stderr)

    uri = s.create_model_pvc(cp, ns)
    s.apply_model(cp, ns, MODEL, s.tiny_model_spec(None, uri, backend="eager"))
    tl = s.Timeline(time.monotonic())
    model = s.wait_model_ready(cp, ns, MODEL, timeout=1500, timeline=tl)
    art = model["status"]["artifact"]
    assert art["phase"] == "Ready" and art["claim"], art

    # The precompile Job's pod and the serving pod ran on the real node, for real.
    job_pods = cp.kubectl_json("get", "pods", "-n", ns, "-l", "job-name")["items"]
    assert job_pods and all(p["spec"]["nodeName"] == NODE_NAME for p in job_pods)
    assert any(p["status"]["phase"] == "Succeeded" for p in job_pods)
    servers = s.server_pods(cp, ns, MODEL)
    assert servers and all(p["spec"]["nodeName"] == NODE_NAME for p in servers)
    assert any(s.pod_ready(p) for p in servers)
    # ... with the release's engine (the chart's default), pulled from the registry.
    assert model["status"]["effective"]["engineImage"] == release["engine"], model["status"]
    for p in [*job_pods, *servers]:
        _pulled(p, release["engine"])
    # Every pod the operator made ran as the uid and fsGroup the namespace assigns: the
    # operator pinned none (a pinned one is refused there: tests/integration/test_scc.py).
    uid = s.scc_range_start(ns)
    for p in [*job_pods, *servers]:
        sc = p["spec"]["securityContext"]
        assert (sc.get("runAsUser"), sc.get("fsGroup")) == (uid, uid), (p["metadata"]["name"], sc)
    # ... loading the artifact from the cache claim, mounted read-only.
    cache = [v for v in servers[0]["spec"]["containers"][0]["volumeMounts"]
             if v["name"] == CACHE_VOLUME]
    assert cache and all(v.get("readOnly") for v in cache), cache

    # It answers through its Service.
    s.ensure_client_pod(cp, ns, release["engine"])
    body = s.completion(cp, ns, MODEL, "hello world, what is the capital of france",
                        max_tokens=4, ignore_eos=True)
    assert body["usage"]["completion_tokens"] == 4, body

    # The chart's pod did the reconciling (its own counters), kept its Lease and never
    # restarted, all along.
    pod_now = s.operator_pods(cp, op_ns)[0]
    assert pod_now["metadata"]["name"] == pod["metadata"]["name"]
    assert pod_now["status"]["containerStatuses"][0]["restartCount"] == 0
    m = _pod_metrics(cp, ns, pod_now)
    assert m.get("spyre_operator_leader") == 1.0, m
    assert m.get("spyre_operator_reconciles_total", 0) > 0, m
    # It wrote the model's children and status itself, with the chart's RBAC, and was never
    # refused (a missing Role verb shows as a 403 in its log and a Degraded model).
    assert m.get(f'spyre_operator_namespace_writes_total{{namespace="{ns}"}}', 0) > 0, m
    log = s.operator_logs(cp, op_ns, tail=2000)
    assert not refusals(log), "\n".join(refusals(log)[:20])
    job = s.jobs(cp, ns)[0]["status"]
    print(f"Job {job.get('startTime')} -> {job.get('completionTime')}; "
          f"apply -> Job complete {tl.since(tl.job_complete)}, -> pod Ready "
          f"{tl.since(tl.pod_ready)}, -> Ready {tl.since(tl.model_ready)}; operator writes "
          f"{s.metric(m, 'spyre_operator_writes_total'):.0f}")


def test_chart_operator_pod_on_plain_kubernetes_pins_its_uid(
    control_plane: ControlPlane, images: dict[str, str], namespace: str,
    plain_operator_namespace: str,
) -> None:
    """Plain Kubernetes with restricted Pod Security (no SCC): the chart's ``podUser: fixed``
    pins the operator pod's uid 65532 (the image's user, with a passwd entry) and the operator
    reconciles under it."""
    cp, op_ns = control_plane, plain_operator_namespace
    pod = s.install_operator(cp, op_ns, images["operator"], watch_namespaces=[namespace],
                             timeout=180, restricted_v2=False)
    _check_operator_pod(cp, op_ns, pod, 65532)
    assert "--pod-user=fixed" in pod["spec"]["containers"][0]["args"]
    # It reconciles: a model whose weights claim is missing gets its status (written by this
    # pod, the only operator) without any pod of its own.
    s.apply_model(cp, namespace, "nothere", s.tiny_model_spec(
        images["engine"], "pvc://missing-claim/tiny", backend="eager"))
    wait_until(lambda: any(c["type"] == "Degraded" and c["reason"] == "ClaimNotFound"
                           for c in (s.get_model(cp, namespace, "nothere") or {})
                           .get("status", {}).get("conditions", [])),
               120, "the pod's status for the model (Degraded ClaimNotFound)", 1)
    # Still Ready, no restart, after a reconcile (a crash after start-up would show by now).
    pod_now = s.operator_pods(cp, op_ns)[0]
    assert s.pod_ready(pod_now), s.operator_diagnostics(cp, op_ns)
    assert pod_now["status"]["containerStatuses"][0]["restartCount"] == 0


def test_a_published_version_is_not_released_again(control_plane: ControlPlane,
                                                  released: dict[str, Any],
                                                  tmp_path: Path) -> None:
    """Issues 47 and 48: ``make release`` of a version the registry has already (the session's
    release) is refused before anything is built, naming what is there; the tests' own
    releases pass ``--replace``."""
    t0 = time.monotonic()
    with pytest.raises(RuntimeError) as refused:
        s._release_script(control_plane, ["release", "--registry", released["registry"],
                                          "--plain-http", "--cpu-engine", "--allow-dirty",
                                          "--out", str(tmp_path)], timeout=300)  # fmt: skip
    msg = str(refused.value)
    assert f"version {released['version']} is published already" in msg, msg
    assert f"{released['registry']}/spyre-model-operator:{released['version']}" in msg, msg
    assert "building" not in msg and "pushing" not in msg, msg
    print(f"refused in {time.monotonic() - t0:.1f}s")


def test_the_release_made_again_from_its_commit_has_its_digests(
    released: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 48, 1: the session's release, made again from the same commit, gives the same
    digests: the operator index (the image as built, dated SOURCE_DATE_EPOCH: a clean rebuild
    is the same image, test_reproducible.py; then labelled and dated by the commit) and the
    chart (packaged with every entry and the archive dated by the commit). Pushed again to the
    same tags: the same content, so nothing the release named changes. Issue 48, 4: its
    labels name the version, the commit, the commit's time and the source it was given, and
    its manifest the base the operator image was built on (not the test image it was
    labelled from)."""
    registry, version = released["registry"], released["version"]
    provenance = script("provenance")

    def skopeo(*args: str) -> Any:
        return json.loads(subprocess.run(
            [release_script.skopeo_bin(), "inspect", "--tls-verify=false", *args],
            check=True, capture_output=True, text=True, timeout=120).stdout)  # fmt: skip

    config = skopeo("--config", f"docker://{released['operator']}")
    commit, when = release_script.source_revision()
    labels = config["config"]["Labels"]
    wanted = provenance.release_labels(version, commit, when, s.RELEASE_SOURCE)
    assert {k: labels.get(k) for k in wanted} == wanted, labels
    assert config["created"].startswith(labels["org.opencontainers.image.created"][:-1]), config
    repo = released["operator"].partition("@")[0]
    [entry] = [m for m in skopeo("--raw", f"docker://{released['operator']}")["manifests"]
               if m["platform"]["architecture"] == build.HOST_ARCH]  # fmt: skip
    annotations = skopeo("--raw", f"docker://{repo}@{entry['digest']}").get("annotations") or {}
    built = release_script.base_annotations(build.in_storage(build.ensure_image("operator")))
    assert built["org.opencontainers.image.base.name"].startswith("localhost/spyre-base"), built
    assert {k: annotations.get(k) for k in built} == built, annotations
    monkeypatch.setenv(provenance.SOURCE_ENV, s.RELEASE_SOURCE)  # as release_args gives it
    operator, _ = release_script.push_operator(registry, version, True, [build.HOST_ARCH])
    assert operator == released["operator"], (operator, released["operator"])
    # what was pushed is not kept in buildah's storage (a kept labelled engine held 9 GB of
    # layers after its source image was rebuilt)
    kept = subprocess.run([*build.buildah_cmd(), "images", "--format", "{{.Name}}:{{.Tag}}"],
                          check=True, capture_output=True, text=True).stdout.split()
    assert not [r for r in kept if "-release-" in r and r.endswith(f":{version}")], kept
    _, chart_digest = release_script.package_and_push_chart(
        version, released["operator"], released["engine"], registry, True, tmp_path)
    assert chart_digest == released["chart_digest"], (chart_digest, released["chart_digest"])


def _attested(verified: str) -> list[dict[str, Any]]:
    """The in-toto statements ``cosign verify-attestation`` printed (one DSSE per line)."""
    return [json.loads(base64.b64decode(json.loads(line)["payload"]))
            for line in verified.splitlines() if line.strip().startswith("{")]  # fmt: skip


def test_the_mirror_holds_the_releases_signatures_and_sboms(
    control_plane: ControlPlane, release: dict[str, Any], released: dict[str, Any],
    tmp_path: Path,
) -> None:
    """Issue 48, 2-3: ``make release --sign-key`` signed every image and the chart and attached
    each image's SBOM (syft, SPDX) as a signed attestation; ``make mirror`` copied signatures
    and attestations with the images. Verified in the mirror as a site does (cosign verify /
    verify-attestation with the release's public key, offline), and refused with a key that is
    not the release's."""
    _, pub = s.release_key(control_plane)
    cosign = release_script.signing.Cosign(plain_http=True)
    try:
        for name in ("operator", "engine", "bundle", "catalog"):
            assert release[name].startswith(f"{release['registry']}/"), release[name]
            cosign.verify(release[name], pub)
        assert released["sboms"], released
        wanted = {"spyre-model-operator": "kopf", "spyre-engine": "vllm"}
        for ref in released["sboms"]:
            mirrored = ref.replace(released["registry"], release["registry"], 1)
            [statement] = _attested(cosign.verify(mirrored, pub, attestation=True))
            assert statement["predicateType"] == "https://spdx.dev/Document", statement
            assert statement["subject"][0]["digest"]["sha256"] == ref.rsplit(":", 1)[1]
            names = {pkg.get("name") for pkg in statement["predicate"]["packages"]}
            repo = ref.split("@")[0].rsplit("/", 1)[1]
            assert wanted[repo] in names, (repo, sorted(names)[:40])
        # The chart (the release's own: the mirror's is re-pinned to the mirror's names).
        cosign.verify(f"{released['chart'].removeprefix('oci://')}@{released['chart_digest']}",
                      pub)
        _, other = s.new_key_pair(tmp_path / "other", "another site")
        with pytest.raises(SystemExit, match="no matching signatures"):
            cosign.verify(release["operator"], other)
    finally:
        cosign.close()


def test_the_release_holds_an_olm_bundle_and_its_catalog(
    release: dict[str, Any], released: dict[str, Any], tmp_path: Path
) -> None:
    """Issue 46, 4: ``make release`` pushed the OLM bundle (the CSV naming the release's own
    images by digest) and a file-based catalog naming that bundle by digest; ``make mirror``
    copied both, digests kept (checked in ``release``). Read from the mirror, layer by layer."""
    version, csv_name = released["version"], f"spyre-model-operator.v{released['version']}"
    files, labels = s.image_files(release["bundle"], tmp_path)
    assert labels["operators.operatorframework.io.bundle.mediatype.v1"] == "registry+v1"
    assert labels["operators.operatorframework.io.bundle.package.v1"] == "spyre-model-operator"
    assert labels["org.opencontainers.image.version"] == version, labels
    csv = yaml.safe_load(files["manifests/spyre-model-operator.clusterserviceversion.yaml"])
    assert csv["metadata"]["name"] == csv_name and csv["spec"]["version"] == version
    assert [i["image"] for i in csv["spec"]["relatedImages"]] == [
        released["operator"], released["engine"]], csv["spec"]["relatedImages"]
    assert "manifests/spyremodels.serving.spyre.dev.crd.yaml" in files, sorted(files)
    annotations = yaml.safe_load(files["metadata/annotations.yaml"])["annotations"]
    assert annotations["operators.operatorframework.io.bundle.channels.v1"] == "candidate"

    files, labels = s.image_files(release["catalog"], tmp_path)
    assert labels["operators.operatorframework.io.index.configs.v1"] == "/configs", labels
    blobs = bundle_script.read_catalog(files["configs/spyre-model-operator/catalog.json"].decode())
    by_schema = {b["schema"]: b for b in blobs}
    assert len(blobs) == len(by_schema) == 3, [b["schema"] for b in blobs]
    assert by_schema["olm.package"]["defaultChannel"] == "candidate"
    assert by_schema["olm.channel"]["entries"] == [{"name": csv_name}]
    bundle = by_schema["olm.bundle"]
    assert bundle["name"] == csv_name and bundle["image"] == released["bundle"], bundle["image"]
    objects = [json.loads(base64.b64decode(p["value"]["data"]))
               for p in bundle["properties"] if p["type"] == "olm.bundle.object"]
    assert csv in objects, "the catalog's CSV is not the bundle's"
    assert {"type": "olm.package", "value": {"packageName": "spyre-model-operator",
                                             "version": version}} in bundle["properties"]
