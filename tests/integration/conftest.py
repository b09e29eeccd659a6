"""Fixtures for operator tests on the local control plane: the CRD and a running operator."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cluster.controlplane import ControlPlane, KubectlError, free_ports, wait_until

ROOT = Path(__file__).resolve().parents[2]
CRD_FILE = ROOT / "crds" / "serving.spyre.dev_spyremodels.yaml"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        # The image tests (marker ``images``) build and run the images with buildah, no
        # cluster: they run in the local session (tests/streams.py), off the cluster
        # session's critical path.
        if "tests/integration/" in str(item.fspath) and item.get_closest_marker("images") is None:
            item.add_marker(pytest.mark.integration)
    mark_node_modules(items)
    items[:] = late_last(items)


#: The fixtures of a test that needs the real node (or the release its pods pull).
NODE_FIXTURES = ("real_node", "released")


def mark_node_modules(items: list[pytest.Item]) -> None:
    """Marker ``node`` on every test of a module where any test uses the real node (or the
    session's release): ``make test`` runs those in the cluster session that starts the node,
    each module whole, and the others (kwok only) in a session of their own beside it, on a
    control plane of their own (tests/streams.py)."""
    modules = {item.module for item in items
               if set(NODE_FIXTURES) & set(getattr(item, "fixturenames", ()))}
    for item in items:
        if getattr(item, "module", None) in modules:
            item.add_marker(pytest.mark.node)


def late_last(items: list[pytest.Item]) -> list[pytest.Item]:
    """The modules that need what ``make test`` builds in the background (tests/streams.py), on
    CPU the earlier tests leave idle, run last, each whole and in its order: first those that
    start KEDA (they import ``KedaStack``; KEDA is built first), then those that publish a
    release (fixture ``released``: the host's images only, so they need nothing from the
    background build any more; they stay last, where they always ran)."""
    releasing = {item.module for item in items
                 if "released" in getattr(item, "fixturenames", ())}
    keda = {item.module for item in items
            if getattr(getattr(item, "module", None), "KedaStack", None) is not None} - releasing

    def rank(item: pytest.Item) -> int:
        module = getattr(item, "module", None)
        return 2 if module in releasing else 1 if module in keda else 0

    return sorted(items, key=rank)  # stable: the order within each rank is kept


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failed test's report carries the end of every running operator's log, lines naming
    the test's namespace first: the kwok session's logs go with its temporary root, and a
    flap seen once (test_happy_path_to_ready's Reconciling, 889b7f2's run) left nothing to
    find it by."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if report.when != "call" or not report.failed:
        return
    kube = getattr(item, "funcargs", {}).get("kube")
    ns = getattr(kube, "ns", None)
    for op in list(OperatorProcess.live):
        if op.log_path is None or not op.log_path.exists():
            continue
        lines = op.log_path.read_text(errors="replace").splitlines()
        mine = [ln for ln in lines if ns and ns in ln][-60:]
        report.sections.append((f"operator log {op.log_path.name} (namespace {ns})",
                                "\n".join(mine + ["-- last lines --"] + lines[-30:])))


class OperatorProcess:
    """`spyre-operator run` as a child process, with its metrics endpoint."""

    #: The instances started and not stopped (their logs go into a failed test's report).
    live: set[OperatorProcess] = set()  # noqa: RUF012 - shared on purpose

    def __init__(self, kubeconfig: Path, log_dir: Path, args: list[str] | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.kubeconfig = kubeconfig
        self.log_dir = log_dir
        self.args = args or ["--all-namespaces"]
        self.env = env or {}
        self.proc: subprocess.Popen[bytes] | None = None
        self.metrics_port, self.health_port = free_ports(2)
        self.log_path: Path | None = None
        self.starts = 0
        #: The bearer token metrics() sends (an operator run with --metrics-auth=kubernetes).
        self.metrics_token: str | None = None

    def start(self, timeout: float = 60) -> None:
        self.starts += 1
        self.log_dir.mkdir(parents=True, exist_ok=True)
        # id(self): a second OperatorProcess in the same run must not truncate the first's log
        self.log_path = self.log_dir / f"operator-{os.getpid()}-{id(self):x}-{self.starts}.log"
        log = open(self.log_path, "wb")  # noqa: SIM115 - owned by the child
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig), **self.env}
        OperatorProcess.live.add(self)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "spyre_operator.cli", "run", *self.args,
             "--metrics-port", str(self.metrics_port),
             "--liveness", f"http://127.0.0.1:{self.health_port}/healthz"],
            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
        )
        try:
            wait_until(self._healthy, timeout, "the operator's liveness endpoint")
        except TimeoutError as e:
            # What it was doing instead (the kwok session of c9da6be's full run saw operators
            # that never served /healthz, with nothing to say why): the log's end.
            raise TimeoutError(f"{e}; its log ({self.log_path}) ends:\n{self.log_tail()}"
                               ) from None

    def _healthy(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(f"operator exited with {self.proc.returncode}: {self.log_tail()}")
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{self.health_port}/healthz", timeout=2
            ) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20) -> None:
        OperatorProcess.live.discard(self)
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, sig)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def kill(self) -> None:
        self.stop(signal.SIGKILL)

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def scrape(self, token: str | None) -> tuple[int, str]:
        """GET /metrics with ``token`` (None: no Authorization header): status and body."""
        req = urllib.request.Request(f"http://127.0.0.1:{self.metrics_port}/metrics")
        if token is not None:
            req.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(req, timeout=5) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def metrics(self) -> dict[str, float]:
        status, text = self.scrape(self.metrics_token)
        assert status == 200, (status, text)
        out: dict[str, float] = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                k, v = line.rsplit(" ", 1)
                out[k] = float(v)
        return out

    def writes(self) -> float:
        """All API writes of this process (every namespace)."""
        return sum(v for k, v in self.metrics().items() if k.startswith("spyre_operator_writes"))

    def namespace_writes(self, namespace: str) -> float:
        """API writes to ``namespace`` only (other tests' models and teardown not counted)."""
        return self.metrics().get(
            f'spyre_operator_namespace_writes_total{{namespace="{namespace}"}}', 0.0)

    def namespace_reconciles(self, namespace: str) -> float:
        """Reconciles of the models in ``namespace``."""
        return self.metrics().get(
            f'spyre_operator_namespace_reconciles_total{{namespace="{namespace}"}}', 0.0)

    def log_tail(self, n: int = 40) -> str:
        if not self.log_path or not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])


@pytest.fixture(scope="session")
def crd(control_plane: ControlPlane) -> Path:
    control_plane.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD_FILE))
    control_plane.wait_established("spyremodels.serving.spyre.dev")
    return CRD_FILE


@pytest.fixture(scope="session", autouse=True)
def release_ahead(request: pytest.FixtureRequest) -> Iterator[Any]:
    """In a session where a test uses ``released``: the release started in the background
    with the session's first test here (tests/realpods/support.py ``ReleaseAhead``), so its
    pushes overlap the modules before the release modules, which run last (issue 43);
    ``SPYRE_RELEASE_AHEAD=0`` releases when ``released`` is first asked for instead."""
    users = [i for i in request.session.items if "released" in getattr(i, "fixturenames", ())]
    if not users or os.environ.get("SPYRE_RELEASE_AHEAD") == "0":
        yield None
        return
    from tests.realpods.support import ReleaseAhead

    cp: ControlPlane = request.getfixturevalue("control_plane")
    factory: pytest.TempPathFactory = request.getfixturevalue("tmp_path_factory")
    ahead = ReleaseAhead(cp, factory.mktemp("release"))
    yield ahead
    ahead.cancel()


@pytest.fixture(scope="session")
def released(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory,
             release_ahead: Any) -> dict[str, Any]:
    """A release in the cluster's OCI registry, once per session (``make release``: both
    images built or reused, pushed, the chart pinned to their digests and pushed):
    release-<version>.json. tests/realpods/support.py ``publish_release`` (begun ahead:
    ``release_ahead``)."""
    from tests.realpods.support import publish_release

    if release_ahead is not None:
        rel: dict[str, Any] = release_ahead.result()
        return rel
    return publish_release(control_plane, tmp_path_factory.mktemp("release"))


@pytest.fixture(scope="package")
def operator(control_plane: ControlPlane, kubeconfig: Path, crd: Path) -> Iterator[OperatorProcess]:
    # Failed compiles are retried after 5 minutes here, so tests that watch a failed model see
    # no automatic retry; test_reconcile_correctness runs its own operator with short delays.
    # A pod no scheduler looks at is reported after 20 s, not 60 (test_operator's
    # scheduler-that-does-not-run test waited a minute by design): the kwok nodes' schedulers
    # look at a new pod within seconds, so no other test's pod comes near it.
    # Package scope: it watches every namespace, so it must be gone before tests/realpods,
    # whose modules run their own operator per namespace (two operators reconciling one
    # model doubled its Events there).
    op = OperatorProcess(kubeconfig, control_plane.root / ".cluster" / "logs",
                         env={"SPYRE_COMPILE_RETRY_BASE_SECONDS": "300",
                              "SPYRE_SCHEDULER_SILENCE_SECONDS": "20"})
    op.start()
    _host_operators.append(op)
    yield op
    _host_operators.remove(op)
    op.stop()


#: The package's all-namespaces operator, once a test started it (see ``no_host_operator``).
_host_operators: list[OperatorProcess] = []


@pytest.fixture(scope="module")
def no_host_operator() -> Iterator[None]:
    """The operator under test runs alone: the package's all-namespaces operator (admin
    credentials), if an earlier module started it, is stopped for the module and started again
    after it. Otherwise it reconciles the module's models too and writes the children the
    operator under test must write with its own (chart) RBAC: a missing verb went unnoticed."""
    stopped = [op for op in _host_operators if op.running()]
    for op in stopped:
        op.stop()
    yield
    for op in stopped:
        op.start()


def assert_no_host_operator() -> None:
    """Fail if the package's operator runs (a test of another operator asks for this)."""
    running = [op.log_path for op in _host_operators if op.running()]
    assert not running, f"the package's all-namespaces operator is running: {running}"


class Kube:
    """Small kubectl helpers bound to one namespace."""

    def __init__(self, cp: ControlPlane, namespace: str) -> None:
        self.cp = cp
        self.ns = namespace

    def kubectl(self, *args: str, check: bool = True, input: str | None = None) -> str:
        r = self.cp.kubectl(*args, "-n", self.ns, check=check, input=input)
        return str(r.stdout)

    def apply_model(self, name: str, spec: dict[str, Any]) -> None:
        doc = {"apiVersion": "serving.spyre.dev/v1alpha1", "kind": "SpyreModel",
               "metadata": {"name": name}, "spec": spec}
        self.kubectl("apply", "--server-side", "--field-manager=test", "--force-conflicts",
                     "-f", "-", input=yaml.safe_dump(doc))

    def try_apply(self, doc: dict[str, Any]) -> subprocess.CompletedProcess[str]:
        return self.cp.kubectl("apply", "-n", self.ns, "--server-side", "--field-manager=test",
                               "-f", "-", input=yaml.safe_dump(doc), check=False)

    def get(self, kind: str, name: str | None = None, selector: str | None = None) -> Any:
        args = ["get", kind] + ([name] if name else []) + (["-l", selector] if selector else [])
        r = self.cp.kubectl(*args, "-n", self.ns, "-o", "json", check=False)
        if r.returncode != 0:
            if "NotFound" in r.stderr:
                return None
            # a KubectlError is "not yet" to wait_until (e.g. the API server restarting)
            raise KubectlError(r.returncode, r.args, r.stdout, r.stderr)
        return json.loads(r.stdout)

    def items(self, kind: str, selector: str | None = None) -> list[dict[str, Any]]:
        return list((self.get(kind, selector=selector) or {}).get("items", []))

    def model(self, name: str) -> dict[str, Any]:
        m = self.get("spyremodel", name)
        assert m is not None, f"SpyreModel {name} not found"
        return m  # type: ignore[no-any-return]

    def condition(self, name: str, type_: str) -> dict[str, Any] | None:
        for c in (self.model(name).get("status") or {}).get("conditions") or []:
            if c["type"] == type_:
                return c  # type: ignore[no-any-return]
        return None

    def wait_condition(self, name: str, type_: str, status: str = "True",
                       reason: str | None = None, timeout: float = 60) -> dict[str, Any]:
        found: dict[str, Any] = {}

        def ok() -> bool:
            c = self.condition(name, type_)
            if c and c["status"] == status and (reason is None or c["reason"] == reason):
                found.update(c)
                return True
            return False

        try:
            wait_until(ok, timeout, f"{name} {type_}={status} {reason or ''}")
        except TimeoutError as e:
            raise AssertionError(
                f"{e}; conditions: {json.dumps(self.model(name).get('status'), indent=1)}"
            ) from None
        return found

    def wait(self, what: Callable[[], Any], timeout: float = 60, desc: str = "") -> Any:
        box: list[Any] = []

        def ok() -> bool:
            v = what()
            if v:
                box.append(v)
                return True
            return False

        try:
            wait_until(ok, timeout, desc or "condition")
        except TimeoutError as e:
            # What the namespace's pods were doing when the wait gave up (a slow machine or a
            # stuck pod: the failure says which, issue 43).
            raise TimeoutError(f"{e}\n{self.pods_summary()}") from e.__cause__
        return box[-1]

    def pods_summary(self, limit: int = 20) -> str:
        """One line per pod of the namespace: phase, node, what is not Ready and why, each
        container's state and restarts (never raises: it is a failure's diagnostics)."""
        try:
            pods = self.items("pods")
        except Exception as e:  # noqa: BLE001 - the API server may be what failed
            return f"pods in {self.ns}: could not list them ({e})"
        return pods_summary(self.ns, pods, limit)


def pods_summary(namespace: str, pods: list[dict[str, Any]], limit: int = 20) -> str:
    """:meth:`Kube.pods_summary`'s text for ``pods`` (pod objects as the API returns them)."""
    lines = [f"pods in {namespace} when the wait gave up ({len(pods)}):"]
    for pod in pods[:limit]:
        meta, status = pod.get("metadata") or {}, pod.get("status") or {}
        parts = [f"  {meta.get('name')}: {status.get('phase')}",
                 f"node={(pod.get('spec') or {}).get('nodeName') or '-'}"]
        if meta.get("deletionTimestamp"):
            parts.append("terminating")
        for c in status.get("conditions") or []:
            if c.get("status") != "True" and (c.get("reason") or c.get("message")):
                parts.append(f"{c.get('type')}={c.get('reason')}: {c.get('message') or ''}"
                             .rstrip(": "))
        for cs in (status.get("initContainerStatuses") or []) + (
                status.get("containerStatuses") or []):
            state = cs.get("state") or {}
            for kind, detail in state.items():
                why = " ".join(str(detail.get(k)) for k in ("reason", "exitCode", "message")
                               if detail.get(k) not in (None, ""))
                parts.append(f"{cs.get('name')} {kind}{' ' + why if why else ''}"
                             f" restarts={cs.get('restartCount', 0)}")
        lines.append(" ".join(parts)[:600])
    if len(pods) > limit:
        lines.append(f"  ... and {len(pods) - limit} more")
    return "\n".join(lines)


def reconcile_now(kube: Kube, operator: OperatorProcess, name: str, timeout: float = 30) -> None:
    """Make ``operator`` reconcile model ``name`` and wait until a full reconcile that saw the
    current state has finished: the bounded wait before asserting that nothing moved.

    The model is labelled twice (a metadata change wakes the operator, no spec edit), each time
    waiting until a reconcile in its namespace finished (``namespace_reconciles``). The second
    finished reconcile started after the first finished (one at a time per model), so it
    started after the first label: it saw everything written before this call.
    """
    for n in (1, 2):
        done = operator.namespace_reconciles(kube.ns)
        kube.kubectl("label", "--overwrite", f"spyremodel/{name}", f"spyre-test-poke={n}")
        kube.wait(lambda done=done: operator.namespace_reconciles(kube.ns) > done, timeout,
                  f"a reconcile of {name} after poke {n}")


def settle_writes(operator: OperatorProcess, namespace: str, quiet: float = 4.0,
                  limit: float = 90.0) -> None:
    """Wait until the operator has written nothing to ``namespace`` for ``quiet`` seconds."""
    seen = {"writes": operator.namespace_writes(namespace), "since": time.monotonic()}

    def quiet_for_long_enough() -> bool:
        now = operator.namespace_writes(namespace)
        if now != seen["writes"]:
            seen.update(writes=now, since=time.monotonic())
            return False
        return time.monotonic() - seen["since"] >= quiet

    try:
        wait_until(quiet_for_long_enough, limit, f"no write to {namespace} for {quiet:.0f} s",
                   interval=0.5)
    except TimeoutError:
        raise AssertionError(f"the operator kept writing to {namespace} for {limit:.0f} s\n"
                             f"{operator.log_tail(20)}") from None


def holds(predicate: Callable[[], Any], seconds: float, what: str, interval: float = 0.3) -> None:
    """Assert ``predicate`` stays true for ``seconds``, failing as soon as it does not."""
    end = time.monotonic() + seconds
    while True:
        assert predicate(), f"{what} stopped holding"
        if time.monotonic() >= end:
            return
        time.sleep(interval)


def holds_over_reconciles(kube: Kube, operator: OperatorProcess, predicate: Callable[[], Any],
                          what: str, reconciles: int = 3, seconds: float = 5,
                          timeout: float = 60) -> None:
    """Assert ``predicate`` holds (polled; fails at once when it does not) for at least
    ``seconds`` *and* until ``operator`` finished ``reconciles`` more reconciles in the
    namespace: "nothing happens" bounded by what the operator did, not only by time."""
    start, t0 = operator.namespace_reconciles(kube.ns), time.monotonic()
    while True:
        assert predicate(), f"{what} stopped holding"
        ran = operator.namespace_reconciles(kube.ns) - start
        if ran >= reconciles and time.monotonic() - t0 >= seconds:
            return
        assert time.monotonic() - t0 < timeout, (
            f"only {ran:.0f} of {reconciles} reconciles in {kube.ns} within {timeout:.0f} s "
            f"while checking that {what} holds")
        time.sleep(0.5)


@pytest.fixture
def kube(control_plane: ControlPlane, namespace: str) -> Kube:
    return Kube(control_plane, namespace)


@pytest.fixture
def wait() -> Callable[..., Any]:
    return wait_until


def now() -> float:
    return time.monotonic()
