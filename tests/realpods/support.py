"""Reusable helpers for real pods on the real node (no pytest, no fixtures).

Used by ``make demo`` (``tests/realpods/demo.py``), ``tests/integration/test_chart_pod.py`` and
the contract tests. Everything takes a :class:`~tests.cluster.controlplane.ControlPlane`
(``cp``) and talks to the cluster with its ``kubectl``/``helm``; nothing leaves the machine.

The pieces, in the order a test uses them::

    cp = ensure_cluster()                         # control plane + real node spyre-real-0
    refs = ensure_images(cp.node)                 # {"operator": ref, "engine": ref}, imported
    ensure_namespace(cp, "team-a")                # PodSecurity `restricted`
    uri = create_model_pvc(cp, "team-a")          # "pvc://models/tiny": the tiny model on a PVC
    install_operator(cp, "spyre-system", refs["operator"], watch_namespaces=["team-a"])
    apply_model(cp, "team-a", "tiny", tiny_model_spec(refs["engine"], uri))
    wait_model_ready(cp, "team-a", "tiny")
    ensure_client_pod(cp, "team-a", refs["engine"])
    body = completion(cp, "team-a", "tiny", "hello world")
    samples = metrics(cp, "team-a", "tiny")       # {"vllm:prefix_cache_hits_total": 3.0, ...}
    uninstall_operator(cp, "spyre-system")

Design notes:

* Placement: the real node is tainted; :func:`placement` gives the nodeSelector and toleration
  every real pod needs. A SpyreModel with a CPU backend (``eager``/``inductor``) requests no
  Spyre cards, so both ``spec.accelerator`` (serving pods) and ``spec.precompile`` (the Job,
  which compiles off the cards) carry it.
* Requests reach models at their ``status.endpoint`` (``http://<svc>.<ns>.svc:<port>/v1``,
  resolved by cluster DNS, routed by kube-proxy) from a small client pod in the same
  namespace (``kubectl exec`` + Python's urllib in the engine image): the host has no route
  to the Service range.
* The chart is installed with ``crds.install=false`` by default and the CRD applied with
  ``kubectl apply --server-side`` (as the test session's ``crd`` fixture does), so the CRD is
  never owned by a Helm release that a test or ``make demo-down`` later removes or re-adopts.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spyre_operator.desired import names

from tests.cluster.controlplane import ControlPlane, KubectlError, NotYet, wait_until
from tests.cluster.node import NODE_NAME, NODE_SELECTOR, NODE_TOLERATION, RealNode
from tests.images import build
from tests.scripts import script

#: The host's platform: the operator image a release in ``make test`` holds (tests/images).
HOST_PLATFORM = f"linux/{build.HOST_ARCH}"

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "spyre-model-operator"
CRD_FILE = ROOT / "crds" / "serving.spyre.dev_spyremodels.yaml"
CRD_NAME = "spyremodels.serving.spyre.dev"

#: Helm release name of the operator (the Deployment and ServiceAccount get this name).
RELEASE = "spyre-model-operator"
#: The model claim and the directory in it that holds the tiny model: ``pvc://models/tiny``.
MODEL_CLAIM = "models"
MODEL_PATH = "tiny"
#: The name clients send in OpenAI requests.
SERVED_NAME = "tiny"
#: The tiny shape the engine tests use: small enough for 2 shared CPU cores, chunk % 64 == 0.
TINY_SHAPE: dict[str, int] = {"maxModelLen": 512, "maxNumSeqs": 4, "maxNumBatchedTokens": 128}
#: The in-cluster HTTP client pod (see :func:`ensure_client_pod`).
CLIENT_POD = "spyre-client"
#: Field manager of the objects applied here.
FIELD_MANAGER = "spyre-realpods"
#: Where the tiny models are built once (outside the repository, like the images).
TINY_MODEL_CACHE = Path(
    os.environ.get("SPYRE_TINY_MODEL_CACHE")
    or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    / "spyre-model-operator" / "tiny-models"
)

Log = Callable[[str], None]


def _quiet(_msg: str) -> None:
    pass


def _stderr(msg: str) -> None:
    print(f"[realpods] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------- cluster + images


def ensure_cluster(root: Path | str | None = None, with_node: bool = True,
                   log: Log = _stderr) -> ControlPlane:
    """Start the local control plane (or reuse a healthy one) and, with ``with_node``, the real
    node ``spyre-real-0`` (or reuse it). Returns the :class:`ControlPlane`; ``cp.node`` is the
    :class:`RealNode`. Never stops anything: callers own the lifetime (``cp.down()``)."""
    cp = ControlPlane(root)
    cp.check_binaries()
    t0 = time.monotonic()
    cp.up()
    if with_node:
        cp.node.check_prerequisites()
        cp.node.up()
    log(f"cluster{' + real node' if with_node else ''} up in {time.monotonic() - t0:.1f}s")
    return cp


def ensure_images(node: RealNode, which: Iterable[str] = ("operator", "engine"),
                  log: Log = _stderr) -> dict[str, str]:
    """Build each image unless its archive is cached (``tests/images/build.py``), import it into
    the real node's containerd unless it is there already, and return ``{name: ref}``, e.g.
    ``{"operator": "localhost/spyre-model-operator:<hash>", "engine": "localhost/spyre-engine:
    <hash>"}``. Use the refs with ``imagePullPolicy: IfNotPresent`` (nothing can be pulled).
    Cold: ~10 min for both (engine build) + 2-3 min engine import; warm: ~1 s."""

    # The kubelet's image reclaim under disk pressure (a shared machine) may have removed the
    # pause image, and then no pod starts: put it back (a listing when it is there).
    node.ensure_base_images()
    refs: dict[str, str] = {}
    for name in which:
        t0 = time.monotonic()
        img = build.ensure_image(name)
        t1 = time.monotonic()
        imported = _import(node, img.archive, log)
        if img.ref not in imported and img.ref not in node.images():
            node.import_image(img.archive, name=img.ref, force=True)
        t2 = time.monotonic()
        log(f"image {img.ref}: build/reuse {t1 - t0:.1f}s, import {t2 - t1:.1f}s")
        refs[name] = img.ref
    return refs


#: The password of the tests' release signing key (release_key).
RELEASE_KEY_PASSWORD = "spyre-test-release"


def release_key(cp: ControlPlane) -> tuple[Path, Path]:
    """(private, public) cosign key pair the tests' releases are signed with, made once per
    cluster (``.cluster/release-key``), as a site makes its own."""
    d = cp.state_dir / "release-key"
    key, pub = d / "release.key", d / "release.pub"
    if key.is_file() and pub.is_file():
        return key, pub
    return new_key_pair(d.with_name(d.name + ".new"), RELEASE_KEY_PASSWORD, into=d)


def new_key_pair(d: Path, password: str, into: Path | None = None) -> tuple[Path, Path]:
    """``cosign generate-key-pair`` in ``d`` (moved to ``into``): (release.key, release.pub)."""
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    cosign, _ = script("release").signing.tools()
    subprocess.run([cosign, "generate-key-pair", "--output-key-prefix", str(d / "release")],
                   check=True, capture_output=True, stdin=subprocess.DEVNULL,
                   env={**os.environ, "COSIGN_PASSWORD": password})  # fmt: skip
    if into is not None:
        shutil.rmtree(into, ignore_errors=True)
        os.replace(d, into)
        d = into
    return d / "release.key", d / "release.pub"


def release_env(cp: ControlPlane) -> dict[str, str]:
    """release.py's environment in the tests: helm's, and the signing key's password."""
    return {**helm_env(cp), "COSIGN_PASSWORD": RELEASE_KEY_PASSWORD}


#: The source repository the tests' releases name (release.py ``--source``): a test clone's
#: origin is a local path, which names no source.
RELEASE_SOURCE = "https://git.example.test/spyre/spyre-model-operator"


def release_args(cp: ControlPlane, out: Path,
                 platforms: Sequence[str] = (HOST_PLATFORM,)) -> list[str]:
    """release.py's arguments for a test's release of ``platforms`` to the cluster's registry,
    signed with the tests' key (:func:`release_key`)."""
    # --allow-dirty: a test's release is of the checkout as it is, not a publication;
    # --replace: the registry outlives a run when the cluster does (make cluster-up)
    return ["release", "--registry", f"{cp.registry}/spyre", "--plain-http", "--cpu-engine",
            "--allow-dirty", "--replace", "--out", str(out), "--platforms", ",".join(platforms),
            "--catalog-base", "scratch",  # opm's image is not served here
            "--sign-key", str(release_key(cp)[0]), "--source", RELEASE_SOURCE]


class ReleaseAhead:
    """The session's release (``publish_release``) started in the background, at a low CPU
    priority, when the real-node session starts, so that its pushes (the 9 GB engine) overlap
    the first modules instead of opening the release modules, which run last (issue 43).
    :meth:`result` waits for it (and raises what it failed with); :meth:`cancel` stops it."""

    def __init__(self, cp: ControlPlane, out: Path, log: Log = _stderr) -> None:
        import threading

        self._cp, self._out, self._log = cp, out, log
        self._proc: subprocess.Popen[str] | None = None
        self._outcome: dict[str, Any] | BaseException | None = None
        self._cancelled = False
        self._lock = threading.Lock()
        self._t0 = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="release-ahead", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            with self._lock:
                if self._cancelled:
                    raise RuntimeError("the release ahead was cancelled")
                self._proc = subprocess.Popen(
                    ["nice", "-n", "10", sys.executable,
                     str(ROOT / "operator" / "scripts" / "release.py"),
                     *release_args(self._cp, self._out)],
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                    env=release_env(self._cp), start_new_session=True)  # fmt: skip
            out, err = self._proc.communicate()
            if self._proc.returncode != 0:
                raise RuntimeError(f"release.py release failed (exit {self._proc.returncode})"
                                   f":\n{err[-4000:]}")  # fmt: skip
            self._outcome = json.loads(out)
        except BaseException as e:  # handed to result()
            self._outcome = e

    def result(self, timeout: float = 3600) -> dict[str, Any]:
        self._thread.join(timeout)
        if self._thread.is_alive():
            self.cancel()
            raise TimeoutError(f"the release ahead took over {timeout:.0f}s")
        if isinstance(self._outcome, BaseException):
            raise self._outcome
        assert self._outcome is not None
        rel = self._outcome
        self._log(f"released {rel['version']} to {rel['registry']} in the background, "
                  f"{time.monotonic() - self._t0:.1f}s after the session's start")
        return rel

    def cancel(self) -> None:
        with self._lock:
            self._cancelled = True
            if self._proc is not None and self._proc.poll() is None:
                import signal

                os.killpg(self._proc.pid, signal.SIGKILL)  # release.py and its buildah
        self._thread.join(60)


def publish_release(cp: ControlPlane, out: Path, log: Log = _stderr,
                    platforms: Sequence[str] = (HOST_PLATFORM,)) -> dict[str, Any]:
    """``make release`` to the cluster's registry (plain HTTP on loopback): both images built
    or reused (tests/images), pushed, the chart pinned to their digests and pushed as
    ``oci://<registry>/spyre/charts/spyre-model-operator``. Returns release-<version>.json
    (``operator``, ``engine``: repository@digest; ``chart``; ``version``). The node pulls
    them from there (its containerd's hosts.toml: tests/cluster/node.py).

    The operator image for ``platforms`` only: by default the host's, the one the node runs
    (``make deps`` built it). The other architectures are built under qemu (~12 min each
    cold): tests/integration/test_release_platforms.py, ``make test-platforms``, not
    ``make test`` (issue 43)."""
    t0 = time.monotonic()
    rel = _release_script(cp, release_args(cp, out, platforms), timeout=3600)
    log(f"released {rel['version']} to {rel['registry']} in {time.monotonic() - t0:.1f}s")
    return rel


def mirror_release(cp: ControlPlane, release: Mapping[str, Any], dest: str, out: Path,
                   log: Log = _stderr) -> dict[str, Any]:
    """``make mirror`` of ``release`` into ``dest`` (``host:port/path``) of the same registry:
    images copied by skopeo with their digests, the chart re-pinned to ``dest``. Returns the
    mirror's release-<version>.json."""
    t0 = time.monotonic()
    rel = _release_script(cp, ["mirror", "--from", release["registry"], "--to", dest,
                               "--plain-http", "--out", str(out)], timeout=1800)
    log(f"mirrored {release['registry']} to {dest} in {time.monotonic() - t0:.1f}s")
    return rel


def image_files(ref: str, tmp: Path) -> tuple[dict[str, bytes], dict[str, str]]:
    """The files (path -> bytes, every layer applied in order) and the labels of the image
    ``ref`` in a plain-HTTP registry, copied with skopeo into ``tmp``: for the small images
    of a release (its OLM bundle and catalog)."""
    import tarfile

    dest = tmp / ref.replace("/", "_").replace(":", "_").replace("@", "_")
    subprocess.run([script("release").skopeo_bin(), "copy", "--quiet", "--src-tls-verify=false",
                    f"docker://{ref}", f"dir:{dest}"], check=True, capture_output=True,
                   timeout=300)  # fmt: skip
    manifest = json.loads((dest / "manifest.json").read_text())
    config = json.loads((dest / manifest["config"]["digest"].split(":", 1)[1]).read_bytes())
    files: dict[str, bytes] = {}
    for layer in manifest["layers"]:
        with tarfile.open(dest / layer["digest"].split(":", 1)[1], mode="r:*") as tar:
            for member in tar.getmembers():
                if member.isfile():
                    data = tar.extractfile(member)
                    assert data is not None
                    files[member.name.removeprefix("./")] = data.read()
    return files, dict((config.get("config") or {}).get("Labels") or {})


def _release_script(cp: ControlPlane, args: Sequence[str], timeout: float) -> dict[str, Any]:
    """operator/scripts/release.py ``args`` with helm's environment; its JSON (the release)."""
    res = subprocess.run(
        [sys.executable, str(ROOT / "operator" / "scripts" / "release.py"), *args],
        capture_output=True, text=True, env=release_env(cp), timeout=timeout)
    if res.returncode != 0:
        raise RuntimeError(f"release.py {args[0]} failed:\n{res.stderr[-4000:]}")
    rel: dict[str, Any] = json.loads(res.stdout)
    return rel


def _import(node: RealNode, archive: Path, log: Log, attempts: int = 3) -> list[str]:
    """``node.import_image`` with retries: two processes importing the same archive at once
    (e.g. ``make demo`` beside a test session) can make ``ctr import`` fail with "failed to
    resolve layers ... not found" while the other drops the unpacked layer blobs; once the
    other import finished, a retry finds the image and returns at once."""
    from tests.cluster.node import NodeError

    for attempt in range(1, attempts + 1):
        try:
            return node.import_image(archive)
        except NodeError as e:
            if attempt == attempts or "not found" not in str(e):
                raise
            log(f"import of {archive.name} raced with another import ({e}); retrying")
            time.sleep(10 * attempt)
    raise AssertionError("unreachable")


def ensure_crd(cp: ControlPlane) -> None:
    """Apply the SpyreModel CRD server-side (as the test session does) and wait Established."""
    cp.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD_FILE))
    cp.wait_established(CRD_NAME)


#: Namespaces that carry this label behave as OpenShift's restricted-v2 SCC makes them
#: (tests/cluster/manifests/restricted-v2.yaml: Kubernetes' own admission policies).
EMULATE_SCC_LABEL = "spyre.dev/emulate-scc"
RESTRICTED_V2_POLICIES = ROOT / "tests" / "cluster" / "manifests" / "restricted-v2.yaml"
#: OpenShift hands each namespace a block of 10000 uids (and groups) above 1000000000.
SCC_RANGE_SIZE = 10000


def scc_range_start(namespace: str) -> int:
    """The first uid (and group) of ``namespace``'s range, as OpenShift annotates it: a block
    of 10000 above 1000000000, derived from the name (stable, distinct across test namespaces
    in practice; a shared block would only make two namespaces share a uid)."""
    import hashlib

    block = int.from_bytes(hashlib.sha256(namespace.encode()).digest()[:4], "big") % 100000
    return 1_000_000_000 + (block + 1) * SCC_RANGE_SIZE


def ensure_restricted_v2_policies(cp: ControlPlane) -> None:
    """Apply the restricted-v2 admission policies (idempotent)."""
    cp.kubectl("apply", "--server-side", "--force-conflicts", "--field-manager", FIELD_MANAGER,
               "-f", str(RESTRICTED_V2_POLICIES))


def _await_restricted_v2(cp: ControlPlane, namespace: str) -> None:
    """Until the policies act in ``namespace``: a pod pinning uid 1001 is refused and one that
    sets none is assigned the range's first uid (server-side dry runs). A policy just created
    takes a moment to reach the API server's admission; a pod created before that would be
    admitted unchecked."""
    first = scc_range_start(namespace)

    def probe(pod_sc: dict[str, Any]) -> subprocess.CompletedProcess[str]:
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": "scc-probe", "namespace": namespace},
               "spec": {"securityContext": {"runAsNonRoot": True,
                                            "seccompProfile": {"type": "RuntimeDefault"},
                                            **pod_sc},
                        "containers": [{"name": "c", "image": "localhost/scc-probe:none",
                                        "securityContext": {
                                            "allowPrivilegeEscalation": False,
                                            "capabilities": {"drop": ["ALL"]}}}]}}
        return cp.kubectl("create", "--dry-run=server", "-o", "json", "-f", "-",
                          input=json.dumps(pod), check=False)

    def acting() -> bool:
        pinned = probe({"runAsUser": 1001})
        if pinned.returncode == 0 or "emulated restricted-v2" not in pinned.stderr:
            raise NotYet(f"a pod pinning uid 1001 was not refused: {pinned.stderr}")
        assigned = probe({})
        if assigned.returncode != 0:
            raise NotYet(f"a pod setting no uid was refused: {assigned.stderr}")
        sc = json.loads(assigned.stdout)["spec"]["securityContext"]
        if (sc.get("runAsUser"), sc.get("fsGroup")) != (first, first):
            raise NotYet(f"not assigned the range's first uid and fsGroup: {sc}")
        return True

    wait_until(acting, 60, f"the restricted-v2 policies acting in {namespace}", interval=0.5)


def ensure_namespace(cp: ControlPlane, namespace: str, restricted: bool = True,
                     labels: Mapping[str, str] | None = None,
                     restricted_v2: bool = True) -> None:
    """Create (or update) ``namespace``; with ``restricted`` it enforces, warns and audits the
    `restricted` Pod Security level; with ``restricted_v2`` it also behaves as an OpenShift
    project under the default restricted-v2 SCC (uid and fsGroup ranges annotated, pods that
    pin a uid outside them refused, pods that set none assigned the first; see
    tests/cluster/manifests/restricted-v2.yaml). Waits for its ``default`` ServiceAccount and
    until the policies act there."""
    lab: dict[str, str] = dict(labels or {})
    ann: dict[str, str] = {}
    if restricted:
        for mode in ("enforce", "warn", "audit"):
            lab[f"pod-security.kubernetes.io/{mode}"] = "restricted"
            lab[f"pod-security.kubernetes.io/{mode}-version"] = "latest"
    if restricted_v2:
        ensure_restricted_v2_policies(cp)
        lab[EMULATE_SCC_LABEL] = "restricted-v2"
        first = scc_range_start(namespace)
        ann = {"openshift.io/sa.scc.uid-range": f"{first}/{SCC_RANGE_SIZE}",
               "openshift.io/sa.scc.supplemental-groups": f"{first}/{SCC_RANGE_SIZE}",
               "openshift.io/sa.scc.mcs": "s0:c26,c0"}
    cp.apply({"apiVersion": "v1", "kind": "Namespace",
              "metadata": {"name": namespace, "labels": lab,
                           **({"annotations": ann} if ann else {})}})
    wait_until(lambda: cp.kubectl("get", "serviceaccount", "default", "-n", namespace,
                                  check=False).returncode == 0,
               30, f"the default ServiceAccount in {namespace}")
    if restricted_v2:
        _await_restricted_v2(cp, namespace)


def placement() -> dict[str, Any]:
    """``{"nodeSelector": ..., "tolerations": [...]}`` that put a pod on the real node."""
    return {"nodeSelector": dict(NODE_SELECTOR), "tolerations": [dict(NODE_TOLERATION)]}


def restricted_security() -> tuple[dict[str, Any], dict[str, Any]]:
    """(pod securityContext, container securityContext) passing PodSecurity `restricted` and
    restricted-v2: no uid, so the image's user runs (the engine's 1001) or the one the
    namespace assigns."""
    pod = {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
    container = {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                 "capabilities": {"drop": ["ALL"]}}
    return pod, container


# ---------------------------------------------------------------------------- the tiny model


def tiny_model_dir(arch: str = "granite") -> Path:
    """The tiny HF-format model (``spyre_engine.testing.tiny_model``), built once into
    ``~/.cache/spyre-model-operator/tiny-models/<arch>`` in a subprocess (it imports torch)."""
    path = TINY_MODEL_CACHE / arch
    if not (path / ".tiny-model-complete").exists():
        subprocess.run([sys.executable, "-m", "spyre_engine.testing.tiny_model", str(path), arch],
                       check=True, capture_output=True, text=True)
    return path


def _copy_readable(src: Path, dest: Path) -> None:
    """Copy ``src`` to ``dest`` (replacing it) with dirs 0755 and files 0644, so any uid
    (the engine's 1001) reads it; hostPath volumes ignore fsGroup."""
    tmp = dest.with_name(f".{dest.name}.partial")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp)
    for d, _dirs, files in os.walk(tmp):
        os.chmod(d, 0o755)
        for f in files:
            os.chmod(os.path.join(d, f), 0o644)
    if dest.exists():
        shutil.rmtree(dest)
    os.replace(tmp, dest)


def create_model_pvc(cp: ControlPlane, namespace: str, claim: str = MODEL_CLAIM,
                     path: str = MODEL_PATH, arch: str = "granite", size: str = "1Gi",
                     model_dir: Path | None = None, timeout: float = 60) -> str:
    """Create the PVC ``claim`` (StorageClass ``local``, ReadWriteMany), wait until it is
    bound to a static hostPath PV, and write the tiny model (or ``model_dir``) into
    ``<pv dir>/<path>`` from the host, readable by every uid. Idempotent. Returns the
    model URI ``pvc://<claim>/<path>`` for ``spec.model.uri``."""
    src = model_dir or tiny_model_dir(arch)
    cp.apply({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": claim, "namespace": namespace,
                     "labels": {"spyre.dev/realpods": "model"}},
        "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "local",
                 "resources": {"requests": {"storage": size}}},
    })

    def bound() -> str | None:
        pvc = cp.kubectl_json("get", "pvc", claim, "-n", namespace)
        if pvc.get("status", {}).get("phase") == "Bound":
            return str(pvc["spec"]["volumeName"])
        return None

    pv_name = wait_until(bound, timeout, f"PVC {namespace}/{claim} Bound", interval=0.5)
    pv = cp.kubectl_json("get", "pv", pv_name)
    host_dir = Path(pv["spec"]["hostPath"]["path"])
    host_dir.mkdir(parents=True, exist_ok=True)
    host_dir.chmod(0o777)
    dest = host_dir / path
    marker = dest / ".tiny-model-complete"
    if not (marker.exists() and (src / ".tiny-model-complete").exists()
            and marker.read_text() == (src / ".tiny-model-complete").read_text()):
        dest.parent.mkdir(parents=True, exist_ok=True)
        _copy_readable(src, dest)
    return f"pvc://{claim}/{path}"


# ---------------------------------------------------------------------------- SpyreModels


def deep_merge(base: dict[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``base`` with ``override`` merged in (dicts recursively; other values replace)."""
    out = copy.deepcopy(base)
    for k, v in override.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def tiny_model_spec(engine_image: str | None,
                    model_uri: str = f"pvc://{MODEL_CLAIM}/{MODEL_PATH}", *,
                    backend: str = "eager", served_name: str = SERVED_NAME,
                    shape: Mapping[str, int] | None = None, prefix_caching: bool = True,
                    replicas: int = 1, grace_seconds: int = 10, output_check: str = "Off",
                    override: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A SpyreModel ``spec`` for the tiny model on the real node with a CPU backend.

    TP 1 and :data:`TINY_SHAPE` (maxModelLen 512, maxNumSeqs 4, chunk 128) unless ``shape``;
    ``eager`` starts fastest, ``inductor`` really compiles into the artifact (minutes).
    The serving pods (``accelerator``) and the precompile Job (``precompile``, used because a
    CPU backend compiles off the cards) both select and tolerate the real node. The engine
    image is used with ``IfNotPresent``; without one (None) the operator's default applies (the
    chart's ``defaults.engineImage``). ``serving.outputCheck`` is ``output_check``: ``Off``
    unless a test is about the check (under ``Enforce`` an eager precompile starts a vLLM of
    its own to record reference answers, ~30 s a model here, and every pod checks them).
    ``override`` is deep-merged last."""
    spec: dict[str, Any] = {
        "model": {"uri": model_uri, "servedName": served_name},
        "compile": {"backend": backend, "tensorParallelSize": 1, **(shape or TINY_SHAPE)},
        "replicas": replicas,
        "serving": {"prefixCaching": prefix_caching, "shutdownGracePeriodSeconds": grace_seconds,
                    "outputCheck": output_check},
        "engine": {"imagePullPolicy": "IfNotPresent",
                   **({"image": engine_image} if engine_image else {})},
        "accelerator": placement(),
        "precompile": placement(),
    }
    return deep_merge(spec, override or {})


def apply_model(cp: ControlPlane, namespace: str, name: str, spec: Mapping[str, Any]) -> None:
    """Server-side apply the SpyreModel ``name`` with ``spec`` (field manager spyre-realpods)."""
    doc = {"apiVersion": "serving.spyre.dev/v1alpha1", "kind": "SpyreModel",
           "metadata": {"name": name, "namespace": namespace}, "spec": dict(spec)}
    cp.kubectl("apply", "--server-side", f"--field-manager={FIELD_MANAGER}", "--force-conflicts",
               "-f", "-", input=json.dumps(doc))


def get_model(cp: ControlPlane, namespace: str, name: str) -> dict[str, Any] | None:
    """The SpyreModel object, or None."""
    r = cp.kubectl("get", "spyremodel", name, "-n", namespace, "-o", "json", check=False)
    return json.loads(r.stdout) if r.returncode == 0 else None


def condition(model: Mapping[str, Any] | None, type_: str) -> dict[str, Any] | None:
    """The condition ``type_`` of a SpyreModel object, or None."""
    for c in ((model or {}).get("status") or {}).get("conditions") or []:
        if c.get("type") == type_:
            return dict(c)
    return None


#: Ready reasons after which waiting longer is pointless (the spec or the engine is broken; for
#: PrecompilePodRejected, the namespace's admission refuses the pod, e.g. a uid restricted-v2
#: does not allow).
FATAL_REASONS = ("PrecompileFailed", "InvalidSpec", "NameConflict", "ClaimNotFound",
                 "PrecompilePodRejected")


@dataclass
class Timeline:
    """Monotonic seconds since ``start`` at which each milestone was first seen."""

    start: float
    job_complete: float | None = None
    pod_ready: float | None = None
    model_ready: float | None = None

    def since(self, t: float | None) -> str:
        return "-" if t is None else f"{t - self.start:.1f}s"


def jobs(cp: ControlPlane, namespace: str) -> list[dict[str, Any]]:
    """The precompile Jobs in ``namespace``."""
    sel = f"{names.COMPONENT}={names.COMPONENT_PRECOMPILE}"
    return list(cp.kubectl_json("get", "jobs", "-n", namespace, "-l", sel)["items"])


def server_pods(cp: ControlPlane, namespace: str, model: str) -> list[dict[str, Any]]:
    """The serving pods of SpyreModel ``model``."""
    sel = ",".join(f"{k}={v}" for k, v in names.server_selector(model).items())
    return list(cp.kubectl_json("get", "pods", "-n", namespace, "-l", sel)["items"])


def pod_ready(pod: Mapping[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


def _job_complete(job: Mapping[str, Any]) -> bool:
    return any(c.get("type") == "Complete" and c.get("status") == "True"
               for c in (job.get("status") or {}).get("conditions") or [])


def wait_model_ready(cp: ControlPlane, namespace: str, name: str, timeout: float = 1800,
                     timeline: Timeline | None = None, on_change: Log | None = None,
                     fatal: Iterable[str] = FATAL_REASONS, interval: float = 1.0
                     ) -> dict[str, Any]:
    """Poll until the SpyreModel's ``Ready`` condition is True; returns the model.

    Records in ``timeline`` (if given) when a precompile Job completed, a serving pod became
    Ready and the model became Ready. ``on_change`` gets each new ``kubectl get`` style line
    (phase changes) as it happens. Raises ``AssertionError`` with the status, the Job and
    serving pods and the recent Events after ``timeout`` or on a ``fatal`` Ready reason."""
    tl = timeline or Timeline(time.monotonic())
    last = [""]

    def ready_model() -> dict[str, Any] | None:
        now = time.monotonic()
        m = get_model(cp, namespace, name)
        ready = condition(m, "Ready")
        if tl.job_complete is None and any(_job_complete(j) for j in jobs(cp, namespace)):
            tl.job_complete = now
        if tl.pod_ready is None and any(pod_ready(p) for p in server_pods(cp, namespace, name)):
            tl.pod_ready = now
        line = (f"Ready={ready['status']}/{ready['reason']}" if ready else "no status yet")
        art = ((m or {}).get("status") or {}).get("artifact") or {}
        if art.get("phase"):
            line += f"  artifact={art['phase']}"
        if on_change and line != last[0]:
            on_change(f"{now - tl.start:6.1f}s  {line}")
        last[0] = line
        if ready and ready["status"] == "True":
            tl.model_ready = now
            if tl.pod_ready is None:
                tl.pod_ready = now
            return m
        if ready and ready.get("reason") in set(fatal):
            raise AssertionError(f"{namespace}/{name} failed: {ready}\n"
                                 + describe(cp, namespace, name))
        return None

    try:
        return wait_until(ready_model, timeout, f"{namespace}/{name} Ready",  # type: ignore[no-any-return]
                          interval=interval)
    except TimeoutError as e:
        raise AssertionError(f"{e}\n" + describe(cp, namespace, name)) from None


def wait_for(cp: ControlPlane, namespace: str, model: str, what: str,
             predicate: Callable[[], Any], timeout: float,
             detail: Callable[[], str] = lambda: "") -> Any:
    """Poll ``predicate`` every 2 s until truthy and return its value (:func:`wait_until`: an
    assertion inside fails at once); on timeout fail with the last "not yet" error,
    ``detail()`` and :func:`describe` of the model (its status, pods and engine logs)."""
    try:
        return wait_until(predicate, timeout, what, interval=2)
    except TimeoutError as e:
        extra = detail()
        raise AssertionError(f"{e}\n" + (f"{extra}\n" if extra else "")
                             + describe(cp, namespace, model)) from e.__cause__


def describe(cp: ControlPlane, namespace: str, name: str, log_lines: int = 30) -> str:
    """Diagnostics for a model that did not get Ready: status, pods, events, container logs."""
    out = []
    m = get_model(cp, namespace, name)
    out.append("status: " + json.dumps((m or {}).get("status"), indent=1))
    r = cp.kubectl("get", "jobs,pods,pvc", "-n", namespace, "-o", "wide", check=False)
    out.append(r.stdout + r.stderr)
    r = cp.kubectl("get", "events", "-n", namespace, "--sort-by=.lastTimestamp", check=False)
    out.append("\n".join(r.stdout.splitlines()[-25:]))
    for pod in cp.kubectl_json("get", "pods", "-n", namespace)["items"]:
        pn = pod["metadata"]["name"]
        r = cp.kubectl("logs", "-n", namespace, pn, "--all-containers", f"--tail={log_lines}",
                       check=False)
        out.append(f"--- logs {pn}\n{r.stdout}{r.stderr}")
    return "\n".join(out)


# ---------------------------------------------------------------------------- Helm + operator


def helm_env(cp: ControlPlane) -> dict[str, str]:
    """The environment helm (and kubectl) run with here: the admin kubeconfig, helm's caches
    in ``.cluster/helm``, the pinned binaries first on PATH."""
    home = cp.state_dir / "helm"
    return {**os.environ, "KUBECONFIG": str(cp.kubeconfig),
            "PATH": f"{cp.bin_dir}:{os.environ['PATH']}",
            "HELM_CACHE_HOME": str(home / "cache"), "HELM_CONFIG_HOME": str(home / "config"),
            "HELM_DATA_HOME": str(home / "data")}


def helm(cp: ControlPlane, *args: str, timeout: float = 600,
         check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run the pinned helm (``cp.bin_dir/helm``) with the admin kubeconfig and its caches in
    ``.cluster/helm``. Raises ``RuntimeError`` with helm's output when ``check`` and it fails."""
    res = subprocess.run([str(cp.bin_dir / "helm"), *args], capture_output=True, text=True,
                         env=helm_env(cp), timeout=timeout)
    if check and res.returncode != 0:
        raise RuntimeError(f"helm {' '.join(args)} failed:\n{res.stdout}\n{res.stderr}")
    return res


def operator_values(operator_image: str | None, watch_namespaces: Iterable[str] | None = None,
                    install_crd: bool = False,
                    extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Chart values for the local operator image on the real node: ``image.repository/tag``
    split from the ref, ``pullPolicy: IfNotPresent``, the real node's nodeSelector and
    toleration, ``crds.install`` = ``install_crd``, and ``watch``: every namespace when
    ``watch_namespaces`` is None, else only those (a Role in each). ``extra`` is merged last.
    Without ``operator_image`` (None) the chart's own image stays (a released chart pins it by
    digest)."""
    vals: dict[str, Any] = {"crds": {"install": install_crd}, **placement()}
    if operator_image is not None:
        repo, _, tag = operator_image.rpartition(":")
        if not repo or "/" in tag:
            raise ValueError(f"operator image {operator_image!r} needs a tag (repository:tag)")
        vals["image"] = {"repository": repo, "tag": tag, "pullPolicy": "IfNotPresent"}
    ns = list(watch_namespaces) if watch_namespaces is not None else None
    vals["watch"] = ({"allNamespaces": True} if ns is None
                     else {"allNamespaces": False, "namespaces": ns})
    return deep_merge(vals, extra or {})


def install_operator(cp: ControlPlane, namespace: str, operator_image: str | None, *,
                     chart: str = str(CHART), chart_flags: Sequence[str] = (),
                     release: str = RELEASE, watch_namespaces: Iterable[str] | None = None,
                     install_crd: bool = False, values: Mapping[str, Any] | None = None,
                     timeout: float = 300, restricted_v2: bool = True,
                     log: Log = _stderr) -> dict[str, Any]:
    """``helm upgrade --install`` the chart into ``namespace`` (created, PodSecurity
    `restricted`, as are missing ``watch_namespaces``) with :func:`operator_values`, then wait
    until the operator pod is Ready. With ``restricted_v2`` (default) ``namespace`` emulates
    OpenShift's restricted-v2 SCC (:func:`ensure_namespace`; as do missing watched
    namespaces) and the chart's ``podUser`` is ``assigned``; without, ``fixed``.
    Without ``install_crd`` the CRD is applied with kubectl first (:func:`ensure_crd`).
    ``chart``/``chart_flags``: another chart, e.g. a release's ``oci://...`` with ``--version``
    (its pinned images then stay: ``operator_image`` None).
    Returns the Ready operator pod. Raises ``AssertionError`` with the pod's state and logs
    if it is not Ready within ``timeout`` (e.g. a crash loop).

    The operator pod resolves names through cluster DNS like any pod; its login handler
    (handlers.login) uses ``KUBERNETES_SERVICE_HOST`` all the same."""
    ensure_namespace(cp, namespace, restricted_v2=restricted_v2)
    for ns in watch_namespaces or ():
        # The chart puts a Role in each watched namespace: it must exist first.
        if cp.kubectl("get", "namespace", ns, check=False).returncode != 0:
            ensure_namespace(cp, ns, restricted_v2=restricted_v2)
    if not install_crd:
        ensure_crd(cp)
    pod_user = {"podUser": "assigned" if restricted_v2 else "fixed"}
    vals = operator_values(operator_image, watch_namespaces, install_crd,
                           deep_merge(pod_user, dict(values or {})))
    vfile = cp.state_dir / "helm" / f"values-{namespace}-{release}.json"
    vfile.parent.mkdir(parents=True, exist_ok=True)
    vfile.write_text(json.dumps(vals, indent=1))
    t0 = time.monotonic()
    # No `--wait`: a crash-looping pod should fail fast with its logs, not after helm's timeout.
    helm(cp, "upgrade", "--install", release, chart, *chart_flags, "--namespace", namespace,
         "-f", str(vfile), "--timeout", f"{int(timeout)}s")
    pod = wait_operator_ready(cp, namespace, release, timeout=timeout)
    log(f"operator {pod['metadata']['name']} Ready in {time.monotonic() - t0:.1f}s")
    return pod


def operator_pods(cp: ControlPlane, namespace: str, release: str = RELEASE
                  ) -> list[dict[str, Any]]:
    """The release's operator pods (newest first)."""
    sel = f"app.kubernetes.io/instance={release},app.kubernetes.io/component=operator"
    items = cp.kubectl_json("get", "pods", "-n", namespace, "-l", sel)["items"]
    return sorted(items, key=lambda p: p["metadata"]["creationTimestamp"], reverse=True)


def _restarts(pod: Mapping[str, Any]) -> int:
    return sum(int(s.get("restartCount", 0))
               for s in (pod.get("status") or {}).get("containerStatuses") or [])


def wait_operator_ready(cp: ControlPlane, namespace: str, release: str = RELEASE,
                        timeout: float = 300, max_restarts: int = 1) -> dict[str, Any]:
    """Wait until the release's Deployment is rolled out and its newest pod Ready; fail early
    (with the previous container's log) once the pod restarted more than ``max_restarts``."""
    def ready_pod() -> dict[str, Any] | None:
        dep = cp.kubectl("get", "deployment", "-n", namespace, "-l",
                         f"app.kubernetes.io/instance={release}", "-o", "json", check=False)
        pods = operator_pods(cp, namespace, release)
        if dep.returncode != 0 or not pods:
            return None
        d = json.loads(dep.stdout)["items"]
        done = all((x.get("status") or {}).get("observedGeneration", 0)
                   >= x["metadata"]["generation"]
                   and (x.get("status") or {}).get("updatedReplicas") == x["spec"]["replicas"]
                   and (x.get("status") or {}).get("readyReplicas") == x["spec"]["replicas"]
                   for x in d) and bool(d)
        live = [p for p in pods if not p["metadata"].get("deletionTimestamp")
                and (p.get("status") or {}).get("phase") in ("Pending", "Running")]
        if done and live and pod_ready(live[0]):
            return live[0]
        if live and _restarts(live[0]) > max_restarts:
            raise AssertionError("the operator pod restarts:\n"
                                 + operator_diagnostics(cp, namespace, release))
        return None

    try:
        return wait_until(ready_pod, timeout, "the operator pod Ready",  # type: ignore[no-any-return]
                          interval=1)
    except TimeoutError:
        raise AssertionError(f"the operator pod is not Ready after {timeout:.0f}s:\n"
                             + operator_diagnostics(cp, namespace, release)) from None


def operator_diagnostics(cp: ControlPlane, namespace: str, release: str = RELEASE,
                         tail: int = 40) -> str:
    """Pod states, events and (previous) logs of the release's operator pods."""
    out = []
    for pod in operator_pods(cp, namespace, release):
        pn = pod["metadata"]["name"]
        out.append(f"pod {pn}: phase={pod['status'].get('phase')} restarts={_restarts(pod)} "
                   f"containers={json.dumps(pod['status'].get('containerStatuses'))[:1500]}")
        for prev in ("--previous", ""):
            r = cp.kubectl("logs", "-n", namespace, pn, f"--tail={tail}",
                           *([prev] if prev else []), check=False)
            if r.stdout.strip():
                out.append(f"--- logs {pn} {prev}\n{r.stdout}")
    r = cp.kubectl("get", "events", "-n", namespace, "--sort-by=.lastTimestamp", check=False)
    out.append("\n".join(r.stdout.splitlines()[-15:]))
    return "\n".join(out)


def bind_metrics_reader(cp: ControlPlane, release_namespace: str,
                        account: str = "scraper") -> str:
    """A token of ``account`` (made in ``release_namespace``), bound to that release's
    ``<namespace>-<release>-metrics-reader`` ClusterRole: what may read the chart-installed
    operator's /metrics (``operator.metricsAuth``). :func:`unbind_metrics_reader` removes the
    ClusterRoleBinding."""
    (role,) = [n.split("/", 1)[1] for n in cp.kubectl(
        "get", "clusterroles", "-o", "name").stdout.split()
        if n.startswith(f"clusterrole.rbac.authorization.k8s.io/{release_namespace}-")
        and n.endswith("-metrics-reader")]  # fmt: skip
    cp.kubectl("create", "serviceaccount", account, "-n", release_namespace)
    cp.kubectl("create", "clusterrolebinding", f"{release_namespace}-{account}",
               f"--clusterrole={role}", f"--serviceaccount={release_namespace}:{account}")
    return str(cp.kubectl("create", "token", account, "-n", release_namespace).stdout.strip())


def unbind_metrics_reader(cp: ControlPlane, release_namespace: str,
                          account: str = "scraper") -> None:
    cp.kubectl("delete", "clusterrolebinding", f"{release_namespace}-{account}", check=False)


def operator_logs(cp: ControlPlane, namespace: str, release: str = RELEASE,
                  tail: int = 200) -> str:
    """The newest operator pod's log (last ``tail`` lines)."""
    pods = operator_pods(cp, namespace, release)
    if not pods:
        return ""
    return cp.kubectl("logs", "-n", namespace, pods[0]["metadata"]["name"], f"--tail={tail}",
                      check=False).stdout


def uninstall_operator(cp: ControlPlane, namespace: str, release: str = RELEASE,
                       wait: bool = True, timeout: float = 120) -> bool:
    """``helm uninstall`` the release if it exists (the CRD and SpyreModels stay). With
    ``wait`` also waits until its pods are gone, so no operator of it writes any more.
    Returns whether a release was removed."""
    r = helm(cp, "status", release, "--namespace", namespace, check=False)
    if r.returncode != 0:
        return False
    helm(cp, "uninstall", release, "--namespace", namespace, "--timeout", f"{int(timeout)}s")
    if wait:
        wait_until(lambda: not operator_pods(cp, namespace, release), timeout,
                   f"the {release} pods in {namespace} to go", interval=0.5)
    return True


# ---------------------------------------------------------------------------- requests


_CLIENT_SCRIPT = r"""
import json, sys, time, urllib.error, urllib.request
url, body, timeout = sys.argv[1], sys.argv[2], float(sys.argv[3])
headers = json.loads(sys.argv[4]) if len(sys.argv) > 4 else {}
req = urllib.request.Request(url, data=body.encode() if body else None,
                             headers={**({"Content-Type": "application/json"} if body else {}),
                                      **headers})
t0 = time.monotonic()
try:
    with urllib.request.urlopen(req, timeout=timeout) as r:
        status, text = r.status, r.read().decode(errors="replace")
except urllib.error.HTTPError as e:
    status, text = e.code, e.read().decode(errors="replace")
except Exception as e:
    status, text = 0, f"{type(e).__name__}: {e}"
print(json.dumps({"status": status, "text": text, "seconds": time.monotonic() - t0}))
"""


def ensure_client_pod(cp: ControlPlane, namespace: str, image: str, name: str = CLIENT_POD,
                      timeout: float = 180) -> str:
    """A pod on the real node that idles, for in-cluster HTTP requests (:func:`http`).
    ``image`` needs ``python3`` on its PATH (the engine or operator image). Passes PodSecurity
    `restricted`. Returns its name once Running."""
    if cp.kubectl("get", "pod", name, "-n", namespace, check=False).returncode != 0:
        pod_sc, c_sc = restricted_security()
        cp.apply({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace,
                         "labels": {"spyre.dev/realpods": "client"}},
            "spec": {
                **placement(),
                "automountServiceAccountToken": False,
                "enableServiceLinks": False,
                "terminationGracePeriodSeconds": 1,
                "securityContext": pod_sc,
                "containers": [{
                    "name": "client", "image": image, "imagePullPolicy": "IfNotPresent",
                    "command": ["python3", "-c",
                                "import signal, sys, time\n"
                                "signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\n"
                                "while True: time.sleep(3600)\n"],
                    "securityContext": c_sc,
                    "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}},
                }],
            },
        })
    cp.kubectl("wait", "--for=condition=Ready", f"pod/{name}", "-n", namespace,
               f"--timeout={int(timeout)}s", timeout=timeout + 10)
    return name


@dataclass
class HttpResult:
    """One in-cluster HTTP exchange: status (0: no response), body text, seconds taken."""

    status: int
    text: str
    seconds: float

    def json(self) -> Any:
        return json.loads(self.text)


def http(cp: ControlPlane, namespace: str, url: str, body: Any = None,
         client: str = CLIENT_POD, timeout: float = 120, raw: str | None = None,
         headers: dict[str, str] | None = None) -> HttpResult:
    """GET ``url`` (or POST ``body`` as JSON, or ``raw`` as it is) from the client pod
    (:func:`ensure_client_pod`), with ``headers``."""
    payload = raw if raw is not None else "" if body is None else json.dumps(body)
    r = cp.kubectl("exec", "-n", namespace, client, "--", "python3", "-c", _CLIENT_SCRIPT, url,
                   payload, str(timeout), json.dumps(headers or {}), timeout=timeout + 30)
    d = json.loads(r.stdout.strip().splitlines()[-1])
    return HttpResult(int(d["status"]), str(d["text"]), float(d["seconds"]))


def service_url(cp: ControlPlane, namespace: str, model: str) -> str:
    """The SpyreModel's ``status.endpoint`` without its ``/v1``: ``http://<svc>.<ns>.svc:<port>``,
    the name an in-cluster client uses (cluster DNS resolves it, kube-proxy routes it)."""
    m = cp.kubectl_json("get", "spyremodel", model, "-n", namespace)
    endpoint = (m.get("status") or {}).get("endpoint")
    assert endpoint, f"SpyreModel {namespace}/{model} has no status.endpoint: {m.get('status')}"
    return str(endpoint).removesuffix("/v1")


def completion(cp: ControlPlane, namespace: str, model: str, prompt: str, max_tokens: int = 16,
               served_name: str = SERVED_NAME, client: str = CLIENT_POD, timeout: float = 300,
               **params: Any) -> dict[str, Any]:
    """POST ``/v1/completions`` through the model's Service; returns the response JSON with
    ``_seconds`` (time inside the cluster) added. Raises ``AssertionError`` unless 200."""
    body = {"model": served_name, "prompt": prompt, "max_tokens": max_tokens, **params}
    res = http(cp, namespace, service_url(cp, namespace, model) + "/v1/completions", body,
               client=client, timeout=timeout)
    if res.status != 200:
        raise AssertionError(f"completion: HTTP {res.status}: {res.text[:2000]}")
    out: dict[str, Any] = res.json()
    out["_seconds"] = res.seconds
    return out


def metrics_text(cp: ControlPlane, namespace: str, model: str,
                 client: str = CLIENT_POD) -> str:
    """The raw Prometheus text of ``/metrics`` through the model's Service."""
    res = http(cp, namespace, service_url(cp, namespace, model) + "/metrics", client=client,
               timeout=60)
    if res.status != 200:
        raise AssertionError(f"/metrics: HTTP {res.status}: {res.text[:2000]}")
    return res.text


def parse_metrics(text: str) -> dict[str, float]:
    """``{"name{labels}": value}`` for every sample line of a Prometheus text exposition."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            k, _, v = line.rpartition(" ")
            try:
                out[k] = float(v)
            except ValueError:
                continue
    return out


def metric(samples: Mapping[str, float], name: str) -> float:
    """The sum of every sample of metric ``name`` (any labels)."""
    return sum(v for k, v in samples.items() if k == name or k.startswith(name + "{"))


def metrics(cp: ControlPlane, namespace: str, model: str,
            client: str = CLIENT_POD) -> dict[str, float]:
    """The model's ``/metrics`` through its Service, parsed (:func:`parse_metrics`)."""
    return parse_metrics(metrics_text(cp, namespace, model, client))


def metric_lines(text: str, wanted: Iterable[str]) -> list[str]:
    """The sample lines of ``text`` whose metric name is one of ``wanted``."""
    want = tuple(wanted)
    return [ln for ln in text.splitlines()
            if ln and not ln.startswith("#") and ln.split("{")[0].split(" ")[0] in want]


__all__ = [
    "CHART", "CLIENT_POD", "CRD_FILE", "CRD_NAME", "FATAL_REASONS", "MODEL_CLAIM", "MODEL_PATH",
    "NODE_NAME", "RELEASE", "SERVED_NAME", "TINY_SHAPE", "HttpResult", "KubectlError",
    "Timeline", "apply_model", "bind_metrics_reader", "completion", "condition",
    "create_model_pvc", "deep_merge",
    "describe", "ensure_client_pod", "ensure_cluster", "ensure_crd", "ensure_images",
    "ensure_namespace", "get_model", "helm", "http", "install_operator", "jobs", "metric",
    "metric_lines", "metrics", "metrics_text", "operator_diagnostics", "operator_logs",
    "operator_pods", "operator_values", "parse_metrics", "placement", "pod_ready",
    "restricted_security", "server_pods", "service_url", "tiny_model_dir", "tiny_model_spec",
    "unbind_metrics_reader", "uninstall_operator", "wait_model_ready", "wait_operator_ready",
]
