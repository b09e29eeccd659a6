"""Fixtures of the contract tests: SpyreModels reconciled on the local control plane, their
precompile Job containers run locally into one shared cache directory.

One operator (this module's namespace only) and one namespace serve every case; one tiny model
plays the model claim for all of them; the cache claim (shared by every SpyreModel, as in a
cluster) is one directory the Jobs fill and the serving containers then mount read-only.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from spyre_engine.testing.tiny_model import build_tiny_model
from spyre_operator.desired import names

from tests.cluster.controlplane import ControlPlane
from tests.integration.conftest import CRD_FILE, Kube, OperatorProcess

from .localpod import (
    ContainerProcess,
    ImageConfig,
    mount_namespace_available,
    parse_containerfile,
    run_to_completion,
    start_container,
)

#: The claim holding the model weights (``pvc://models/tiny``) and the path inside it.
MODEL_CLAIM = "models"
MODEL_PATH = "tiny"
#: How long a Job's container may run and a server may take to start (2 shared CPU cores).
PRECOMPILE_TIMEOUT = 900.0
STARTUP_TIMEOUT = 420.0
RECONCILE_TIMEOUT = 180.0


@dataclass(frozen=True)
class Case:
    """One SpyreModel of the contract."""

    name: str
    spec: dict[str, Any]
    #: Really compiles (inductor): a minute or more on CPU.
    slow: bool = False

    @property
    def pooling(self) -> bool:
        return self.spec.get("task", "generate") != "generate"


def _model(**spec: Any) -> dict[str, Any]:
    return {"model": {"uri": f"pvc://{MODEL_CLAIM}/{MODEL_PATH}"}, **spec}


CASES = [
    # Defaults everywhere: TP 1, maxModelLen 4096, maxNumSeqs 4, chunk 1024, sendnn, port 8000.
    Case("gen-tp1", _model(compile={"tensorParallelSize": 1})),
    # A non-default chunk and max length, another port, a short drain, no prefix caching.
    Case(
        "gen-chunk",
        _model(
            compile={"maxModelLen": 512, "maxNumBatchedTokens": 128, "maxNumSeqs": 2},
            serving={"port": 8080, "shutdownGracePeriodSeconds": 5, "prefixCaching": False},
        ),
    ),
    # A pooling model compiled for static warmup shapes.
    Case(
        "embed",
        _model(
            task="embed",
            compile={"warmupShapes": [{"promptLen": 64, "batchSize": 4}]},
            serving={"shutdownGracePeriodSeconds": 10},
        ),
    ),
]
CASE_IDS = [c.name for c in CASES]
#: Cases that run in the serving tests; the slow one proves the read-only cache with a backend
#: that really compiles into the artifact (inductor takes locks in its cache dir on every start).
SERVE_CASES = [
    *CASES,
    Case(
        "gen-inductor",
        _model(
            compile={
                "backend": "inductor",
                "maxModelLen": 256,
                "maxNumSeqs": 2,
                "maxNumBatchedTokens": 128,
            },
            serving={"shutdownGracePeriodSeconds": 5},
        ),
        slow=True,
    ),
]
SERVE_PARAMS = [
    # A loaded 2-core machine needs up to ten minutes for the inductor compile alone.
    pytest.param(
        c.name, marks=[pytest.mark.slow, pytest.mark.timeout(1800)] if c.slow else [], id=c.name
    )
    for c in SERVE_CASES
]


@dataclass
class Reconciled:
    """What the operator wrote for one case, read back from the API server."""

    case: Case
    model: dict[str, Any]
    job: dict[str, Any]
    job_pod: dict[str, Any]
    deployment: dict[str, Any]
    server_pod: dict[str, Any]
    cache_pvc: dict[str, Any]

    @property
    def key(self) -> str:
        return str(self.model["status"]["artifact"]["key"])

    def job_template_pod(self) -> dict[str, Any]:
        """The Job's pod template with the real pod's identity (for the downward API)."""
        return _template_pod(self.job["spec"]["template"], self.job_pod)

    def server_template_pod(self) -> dict[str, Any]:
        """The Deployment's pod template with a real serving pod's identity."""
        return _template_pod(self.deployment["spec"]["template"], self.server_pod)


def _template_pod(template: dict[str, Any], real: dict[str, Any]) -> dict[str, Any]:
    meta = {**real["metadata"], "labels": template["metadata"].get("labels", {})}
    return {"metadata": meta, "spec": template["spec"], "status": real.get("status", {})}


@dataclass
class JobRun:
    """The precompile Job's container, run locally to completion."""

    exit_code: int
    termination_message: str
    log_tail: str


@dataclass
class Host:
    """The host directories that play the pods' volumes."""

    root: Path
    claims: dict[str, Path]
    image: ImageConfig
    mount_namespace: bool
    logs: Path
    runs: list[ContainerProcess] = field(default_factory=list)

    def volume_hosts(
        self, pod: dict[str, Any], scratch: Path, claims: dict[str, Path] | None = None
    ) -> dict[str, Path]:
        """Host dir per volume of ``pod``: claims by name, emptyDirs fresh (Memory: /dev/shm)."""
        claims = claims or self.claims
        out: dict[str, Path] = {}
        for v in pod["spec"].get("volumes") or []:
            if "persistentVolumeClaim" in v:
                out[v["name"]] = claims[v["persistentVolumeClaim"]["claimName"]]
            elif "emptyDir" in v:
                if (v["emptyDir"] or {}).get("medium") == "Memory":
                    out[v["name"]] = Path("/dev/shm")
                else:
                    d = scratch / "emptydir" / v["name"]
                    d.mkdir(parents=True)
                    out[v["name"]] = d
            else:
                raise AssertionError(f"volume {v['name']}: unsupported source {v}")
        return out

    def start(
        self, pod: dict[str, Any], container: str, label: str, claims: dict[str, Path] | None = None
    ) -> ContainerProcess:
        """Start ``container`` of ``pod`` locally; killed (by process group) at module end."""
        scratch = Path(tempfile.mkdtemp(prefix=f"{label}-", dir=self.root))
        proc = start_container(
            image=self.image,
            pod=pod,
            container_name=container,
            volume_hosts=self.volume_hosts(pod, scratch, claims),
            scratch=scratch,
            log_path=self.logs / f"{label}.log",
            use_mount_namespace=self.mount_namespace,
        )
        self.runs.append(proc)
        return proc


def _scratch_base() -> str | None:
    # Not under /tmp: inside the container's mount namespace the pod's /tmp emptyDir is
    # mounted over /tmp, which would hide the other volumes' directories.
    return "/var/tmp" if os.path.isdir("/var/tmp") and os.access("/var/tmp", os.W_OK) else None


@pytest.fixture(scope="module")
def host() -> Iterator[Host]:
    """Scratch root, the model claim (one tiny model) and the empty cache claim."""
    # Short host paths: vLLM binds ZMQ IPC sockets under TMPDIR, which the engine puts in the
    # artifact for inductor (<cache>/artifacts/<32-hex key>/tmp/<uuid>), and a socket path may
    # not exceed 107 bytes. In the pod that is 90 bytes under /cache; keep the stand-in close.
    root = Path(tempfile.mkdtemp(prefix="sc", dir=_scratch_base()))
    models = root / "m"
    build_tiny_model(models / MODEL_PATH, arch="granite")
    cache = root / "c"
    cache.mkdir(parents=True)
    longest_socket = len(f"{cache}/artifacts/{'k' * 32}/tmp/{'u' * 36}")
    assert longest_socket <= 107, f"scratch root {root} is too long for vLLM's IPC sockets"
    logs = root / "logs"
    logs.mkdir()
    h = Host(
        root=root,
        claims={MODEL_CLAIM: models, "spyre-compile-cache": cache},
        image=parse_containerfile(),
        # SPYRE_CONTRACT_NO_MOUNT_NAMESPACE=1 tries the permissions-only fallback.
        mount_namespace=mount_namespace_available()
        and not os.environ.get("SPYRE_CONTRACT_NO_MOUNT_NAMESPACE"),
        logs=logs,
    )
    yield h
    for proc in h.runs:
        proc.kill()
    if os.environ.get("SPYRE_KEEP_CONTRACT_DIR"):
        print(f"contract scratch kept at {root}")
        return
    for p in (root,):
        # make_readonly may have been used (no mount namespace): restore write bits first.
        for dirpath, dirnames, _ in os.walk(p):
            for d in dirnames:
                with contextlib.suppress(OSError):
                    os.chmod(os.path.join(dirpath, d), 0o755)
        shutil.rmtree(p, ignore_errors=True)


@pytest.fixture(scope="module")
def contract_namespace(control_plane: ControlPlane) -> Iterator[str]:
    """One namespace for every case, PodSecurity ``restricted`` enforced like the others."""
    control_plane.recycle_pvs()
    name = f"t-contract-{uuid.uuid4().hex[:6]}"
    labels = {f"pod-security.kubernetes.io/{m}": "restricted" for m in ("enforce", "warn", "audit")}
    labels["spyre.dev/test-namespace"] = "true"
    control_plane.apply(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}
    )
    yield name
    control_plane.kubectl(
        "delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False, timeout=30
    )


@pytest.fixture(scope="module")
def contract_operator(
    control_plane: ControlPlane,
    kubeconfig: Path,
    contract_namespace: str,
) -> Iterator[OperatorProcess]:
    """The operator (and its CRD), watching only the contract namespace."""
    control_plane.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD_FILE))
    control_plane.kubectl(
        "wait", "--for=condition=Established", "--timeout=60s",
        "crd/spyremodels.serving.spyre.dev",
    )  # fmt: skip
    op = OperatorProcess(
        kubeconfig,
        control_plane.root / ".cluster" / "logs",
        args=["--namespace", contract_namespace],
    )
    op.start()
    yield op
    op.stop()


@pytest.fixture(scope="module")
def reconciled(
    control_plane: ControlPlane, contract_namespace: str, contract_operator: OperatorProcess
) -> dict[str, Reconciled]:
    """Apply every case (and the model claim); wait until Ready; read back what was written."""
    kube = Kube(control_plane, contract_namespace)
    kube.kubectl(
        "apply", "-f", "-",
        input=(
            "apiVersion: v1\nkind: PersistentVolumeClaim\n"
            f"metadata: {{name: {MODEL_CLAIM}}}\n"
            "spec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 1Gi}}}\n"
        ),
    )  # fmt: skip
    for case in SERVE_CASES:
        kube.apply_model(case.name, case.spec)
    out: dict[str, Reconciled] = {}
    for case in SERVE_CASES:
        kube.wait_condition(case.name, "Ready", "True", "Serving", timeout=RECONCILE_TIMEOUT)
        model = kube.model(case.name)
        job_name = model["status"]["artifact"]["jobName"]
        job = kube.get("job", job_name)
        job_pods = kube.items("pods", f"job-name={job_name}")
        dep = kube.get("deployment", names.server_name(case.name))
        selector = ",".join(f"{k}={v}" for k, v in names.server_selector(case.name).items())
        server_pods = kube.items("pods", selector)  # Ready: the pods are there
        claim = dep["spec"]["template"]["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"]
        assert job and job_pods and dep, f"{case.name}: Job, its pod or the Deployment missing"
        out[case.name] = Reconciled(
            case=case,
            model=model,
            job=job,
            job_pod=job_pods[0],
            deployment=dep,
            server_pod=server_pods[0],
            cache_pvc=kube.get("pvc", claim),
        )
    return out


@pytest.fixture(scope="module")
def precompiled(host: Host, reconciled: dict[str, Reconciled]) -> Callable[[str], JobRun]:
    """Run a case's precompile Job container locally (once), into the one shared cache claim."""
    runs: dict[str, JobRun] = {}

    def run(name: str) -> JobRun:
        if name not in runs:
            pod = reconciled[name].job_template_pod()
            container = pod["spec"]["containers"][0]["name"]
            proc = host.start(pod, container, f"precompile-{name}")
            code = run_to_completion(proc, PRECOMPILE_TIMEOUT)
            runs[name] = JobRun(code, proc.termination_message(), proc.log_tail(60))
        return runs[name]

    return run
