"""``make test``: the cluster tests and the local tests as three pytest sessions side by side.

The tests that need the local cluster (marker ``integration``: kwok, the real node, the
contract tests) spend most of their time waiting on the API server, the operator and pods;
the local ones (unit, golden, the image tests, the real engine on CPU) need no cluster. One
session ran them one after the other and left a core idle for most of the hour; here the local
session runs beside the cluster tests, at a lower CPU priority (``nice``, a low-weight cgroup)
so the control plane, the operators under test and the real node keep theirs.

The cluster tests are two sessions, each on a control plane of its own: the modules that need
the real node (marker ``node``, set at collection: tests/integration/conftest.py; the contract
and real-pod tests, the node's, DNS, KEDA and release modules), the run's critical path, on the
repository's ``.cluster/``; the kwok-only modules beside them, on one under a temporary
directory (``$SPYRE_CLUSTER_ROOT``, tests/cluster/fixtures.py), where the all-namespaces
operators those tests start never see a real-node module's models. One after the other, the
kwok modules' ~15 minutes were on the critical path.

The real-node session's output is passed on as it comes; the kwok and local sessions' are kept
in files and printed whole after it, so no report is interleaved with another; the cluster
sessions' FAILED/ERROR lines are repeated at the very end (where CI's excerpt of the output
is). The exit status is the first that is not 0 of the real-node, kwok and local sessions'.

Beside them, on CPU nothing else wants (an idle cgroup: nice alone did not keep it there,
tests/cluster/background.py) and at the lowest I/O priority, what only the cluster session's
later tests need is built: prometheus-adapter (``tests/cluster/metrics-deps.sh``, ~1.5 min cold; the
real-node autoscaling module, well after the kwok modules), KEDA and its HTTP add-on
(``tests/cluster/keda-deps.sh``, ~7 min on a cold machine; the scale-to-zero modules); nothing
once cached. The operator image for the release's other architectures (qemu) is not built
here: ``make test`` publishes the host's only (``make test-platforms`` proves the others).
The cluster session leaves a core idle for much of its run, and tests/integration/conftest.py
orders the modules that need these last (KEDA's, then those publishing a release); they wait
for the build (each script holds a lock; while they wait, the build runs at a normal weight,
before the test's own timeout starts: tests/cluster/prebuilt.py) or build what is missing
themselves. Keeping KEDA out
of ``make deps`` takes its ~7 minutes off a cold run's set-up, where the Go builds hold both
cores. The build is stopped if it is still running when the sessions end; the run's last
lines then say how far it got (each step's end, with its time of day) and where it ran.
``SPYRE_BACKGROUND_BUILD`` replaces its command (empty: none).

With arguments (``make test PYTEST_ARGS=...``) it is one ordinary pytest session with them.

Ctrl-C and ``.ci/run``'s budget signal the whole process group: every session gets SIGINT,
stop their running test and report; this process waits for them and then prints. Each
session names its running test in ``$SPYRE_CURRENT_TEST_FILE.<session>``, emptied when it
ends uninterrupted (``.ci/run`` prints those still running when the run hits its budget).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

if not __package__:  # run as a script (make test): the repository's root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.cluster import background  # noqa: E402

#: The cluster sessions: the real-node modules ("cluster", the critical path) and the kwok-only
#: ones ("kwok", on a control plane of their own). Every ``integration`` test lives in these
#: folders (tests/unit/test_streams.py checks it): the local session leaves them out by
#: marker, so one elsewhere would run in neither.
CLUSTER_DIRS = ["tests/integration", "tests/contract", "tests/realpods"]
CLUSTER = ["-m", "integration and node", "--durations=30", *CLUSTER_DIRS]
KWOK = ["-m", "integration and not node", "--durations=15", *CLUSTER_DIRS]
LOCAL = ["-m", "not integration", "--durations=15", "tests"]
SESSIONS = ("cluster", "kwok", "local")
_ORDER = (*SESSIONS, "build")
#: pytest's short-summary lines that the run's end repeats for the cluster sessions
FAILURE_LINES = (b"FAILED ", b"ERROR ")
#: Where the kwok session's control plane lives (tests/cluster/fixtures.py).
KWOK_ROOT_ENV = "SPYRE_CLUSTER_ROOT"
#: Niceness of the local session (the real engine on CPU is its heavy part). With autogroups,
#: nice weighs only against the processes of its own session (the cluster session's pytest and
#: the operators it starts), not against the real node's (its own cgroup, tests/cluster/node.py)
#: nor the control plane's (sessions of their own): against those the local session's weight is
#: its cgroup's, LOCAL_SHARES (1024 is a normal one: half, a third of the CPU against a busy
#: node). Before, each engine a local test started in a session of its own had a full share of
#: its own. The cluster session, the longer one, is the run's critical path (CI of f6fe5e3 ran
#: both at twice their quiet times); the local one has the slack, and its tests' timeouts are
#: failure bounds with room for that.
LOCAL_NICENESS = 10
LOCAL_SHARES = 512
#: The background build, on CPU nobody else wants: prometheus-adapter, then KEDA (in the order
#: the cluster session's modules need them).
_TESTS = Path(__file__).resolve().parent
#: Its steps, in that order: (name, command, its variable). Each step's end is logged with the
#: time of day: a build stopped at the end shows in the run's last lines how far it got and when
#: (CI shows only the end of the output).
_STEPS = (
    ("prometheus-adapter", shlex.quote(str(_TESTS / "cluster/metrics-deps.sh")), "a"),
    ("KEDA", shlex.quote(str(_TESTS / "cluster/keda-deps.sh")), "keda"),
)
BACKGROUND_BUILD = shlex.join(["sh", "-c", " ".join([
    'echo "[background] $(date -u +%T) started" >&2;',
    *(f'{cmd} >/dev/null; {var}=$?; echo "[background] $(date -u +%T) {name}: exit ${var}" >&2;'
      for name, cmd, var in _STEPS),
    f"exit $(( {' || '.join(var for _, _, var in _STEPS)} ))"])])
BACKGROUND_NICENESS = 19
BUILT = "background build (prometheus-adapter, KEDA)"


#: Each session's per-test timings (JUnit XML), kept outside the checkout for the next look at
#: a slow run (CI runs where the caches are): the newest RUNS_KEPT files (three runs).
RUNS_DIR = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / \
    "spyre-model-operator" / "runs"
RUNS_KEPT = 9
#: /proc/stat's cpu line, in its order (the run's last lines share them out)
_CPU_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def _cpu_times() -> list[int]:
    try:
        with open("/proc/stat") as f:
            return [int(v) for v in f.readline().split()[1:len(_CPU_FIELDS) + 1]]
    except (OSError, ValueError):
        return []


def _cpu_pressure_us() -> int | None:
    """Microseconds some task waited for a CPU (PSI), since boot."""
    try:
        with open("/proc/pressure/cpu") as f:
            return int(f.readline().rsplit("total=", 1)[1])
    except (OSError, ValueError, IndexError):
        return None


def _machine(before: tuple[list[int], int | None], after: tuple[list[int], int | None],
             seconds: float) -> str:
    """Where the machine's CPU time went during the run (CI shows only the end of the output:
    a slow run says here whether it was its own load, another tenant's (steal) or neither)."""
    (cpu0, psi0), (cpu1, psi1) = before, after
    if not cpu0 or len(cpu0) != len(cpu1):
        return ""
    spent = [b - a for a, b in zip(cpu0, cpu1, strict=True)]
    total = sum(spent) or 1
    shares = {name: 100 * v / total for name, v in zip(_CPU_FIELDS, spent, strict=False)}
    shares["system"] += shares.pop("irq") + shares.pop("softirq")
    line = f"machine over the run ({os.cpu_count()} CPUs): " + ", ".join(
        f"{name} {share:.0f}%" for name, share in shares.items())
    if psi0 is not None and psi1 is not None and seconds > 0:
        line += (f"; a task waited for a CPU {100 * (psi1 - psi0) / 1e6 / seconds:.0f}% of the "
                 "time")
    return line


#: Where the real node's pods are accounted (tests/cluster/node.py: its cgroup
#: ``/spyre-node-<slot>`` in every hierarchy): cgroup v1's cpuacct, or v2's unified one.
_NODE_GROUPS = ("cpuacct/spyre-node-*", "spyre-node-*")


def _node_cpu_ns(root: Path = Path("/sys/fs/cgroup")) -> dict[str, int]:
    """CPU nanoseconds each running real node's cgroup has used (its pods, kubelet and
    containerd), by cgroup: sampled while the sessions run, the last sample kept (the node's
    cgroup goes with the node)."""
    seen: dict[str, int] = {}
    for pattern in _NODE_GROUPS:
        for group in root.glob(pattern):
            if (used := background.usage_ns(group)) is not None:
                seen.setdefault(group.name, used)
    return seen


def _cpu_shares(machine_ns: int, used: dict[str, int], node_ns: int) -> str:
    """Where the run's CPU went, in core-minutes: each session's (with a cpuacct group
    everything it started, its control plane and operators included, but the real node's
    pods; without one, its processes and those it waited for: wait4's rusage), the background
    build's where counted, the real node's cgroup (its pods, kubelet, containerd), the rest."""
    if machine_ns <= 0:
        return ""
    minutes = {(f"{name} session" if name in SESSIONS else "background build"): ns / 1e9 / 60
               for name, ns in sorted(used.items(), key=lambda kv: _ORDER.index(kv[0]))}
    minutes["real node (its cgroup)"] = node_ns / 1e9 / 60
    rest = machine_ns / 1e9 / 60 - sum(minutes.values())
    return (f"CPU used over the run: {machine_ns / 1e9 / 60:.2f} core-min: " + ", ".join(
        f"{name} {m:.2f}" for name, m in minutes.items()) + f", the rest {max(rest, 0):.2f}")


def _junit(session: str, stamp: str) -> list[str]:
    """The session's JUnit XML in RUNS_DIR (older ones beyond RUNS_KEPT removed)."""
    try:
        RUNS_DIR.mkdir(parents=True, exist_ok=True)
        for old in sorted(RUNS_DIR.glob("*.xml"))[:-RUNS_KEPT + 1]:
            old.unlink(missing_ok=True)
    except OSError:
        return []
    return [f"--junitxml={RUNS_DIR / f'{stamp}-{session}.xml'}"]


def _env(session: str) -> dict[str, str]:
    env = dict(os.environ)
    current = env.get("SPYRE_CURRENT_TEST_FILE")
    if current:
        env["SPYRE_CURRENT_TEST_FILE"] = f"{current}.{session}"
    return env


def _pytest(args: list[str]) -> list[str]:
    return [sys.executable, "-m", "pytest", *args]


def _ignore(signum: int, frame: Any) -> None:
    """A handler that does nothing: this process outlives its sessions' SIGINT to print their
    reports. (SIG_IGN would be inherited by the sessions, and Python would then never raise
    KeyboardInterrupt in them.)"""


def main(argv: list[str]) -> int:
    if argv:
        return subprocess.call(_pytest(["--durations=30", *argv]))
    signal.signal(signal.SIGINT, _ignore)
    signal.signal(signal.SIGTERM, _ignore)
    log_dir = Path(tempfile.mkdtemp(prefix="spyre-make-test-"))
    kwok_root = Path(tempfile.mkdtemp(prefix="spyre-kwok-cluster-"))
    logs = {"kwok": log_dir / "kwok.log", "local": log_dir / "local.log"}
    start = time.monotonic()
    machine_before = _cpu_times(), _cpu_pressure_us()
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    group = background.cgroup()
    if group is not None:  # for the sessions' tests that wait for the build (background.needed)
        os.environ[background.ENV] = str(group)
    # where each one's CPU is counted, all it starts included (None: wait4's rusage only)
    acct = {name: background.accounting(f"acct-{name}") for name in (*SESSIONS, "build")}
    build = _background_build(log_dir / "build.log", group, acct["build"])
    local_group = background.cgroup(name="local", shares=LOCAL_SHARES)
    with open(logs["local"], "wb") as out:
        niced = ["nice", "-n", str(LOCAL_NICENESS), *_pytest([*LOCAL, *_junit("local", stamp)])]
        local = subprocess.Popen(background.wrap(niced, local_group, acct["local"]), stdout=out,
                                 stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 env=_env("local"))
    with open(logs["kwok"], "wb") as out:
        kwok = subprocess.Popen(background.wrap(_pytest([*KWOK, *_junit("kwok", stamp)]),
                                                acct["kwok"]), stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env={**_env("kwok"), KWOK_ROOT_ENV: str(kwok_root)})
    cluster = subprocess.Popen(background.wrap(_pytest([*CLUSTER, *_junit("cluster", stamp)]),
                                               acct["cluster"]),
                               env=_env("cluster"), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    cluster_failures: list[bytes] = []
    relay = threading.Thread(target=_relay, args=(cluster, cluster_failures), daemon=True)
    relay.start()
    took: dict[str, float] = {}
    codes: dict[str, int] = {}
    pending = {"cluster": cluster, "kwok": kwok, "local": local}
    cpu_ns: dict[str, int] = {}
    node_ns: dict[str, int] = {}
    node_base = _node_cpu_ns()  # a node already up (its earlier use is not this run's)
    sampled = 0.0
    while pending:
        for name, proc in list(pending.items()):
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                proc.returncode = os.waitstatus_to_exitcode(status)
                codes[name], took[name] = proc.returncode, time.monotonic() - start
                cpu_ns[name] = int((usage.ru_utime + usage.ru_stime) * 1e9)
                del pending[name]
        if time.monotonic() - sampled > 10:
            node_ns.update(_node_cpu_ns())
            sampled = time.monotonic()
        time.sleep(1)
    relay.join(timeout=30)
    machine_after = _cpu_times()
    machine = _machine(machine_before, (machine_after, _cpu_pressure_us()),
                       time.monotonic() - start)
    spent = dict(zip(_CPU_FIELDS, (b - a for a, b in zip(machine_before[0], machine_after,
                                                          strict=False)), strict=False))
    busy = sum(spent.get(f, 0) for f in ("user", "nice", "system", "irq", "softirq"))
    background.stop(local_group)  # what a local test left running (an engine) goes with it
    _stop_cluster(kwok_root)
    built = _stop(build, group, log_dir / "build.log", start)
    for name, g in acct.items():  # a counted group's figure replaces the session's rusage
        if (used := background.usage_ns(g)) is not None:
            cpu_ns[name] = used
        background.release(g)
    cpu = _cpu_shares(int(busy * 1e9 / os.sysconf("SC_CLK_TCK")), cpu_ns, sum(
        max(v - node_base.get(k, 0), 0) for k, v in node_ns.items()))
    sys.stdout.flush()
    failures = list(cluster_failures)
    for name, title in (("kwok", "kwok tests (the control plane without the real node"),
                        ("local", "local tests (unit, golden, images, engine")):
        report = logs[name].read_bytes()
        print(f"\n{'=' * 30} {title}; their session's output) {'=' * 30}", flush=True)
        sys.stdout.buffer.write(report)
        if name == "kwok":
            failures += [line + b"\n" for line in report.splitlines()
                         if line.startswith(FAILURE_LINES)]
    shutil.rmtree(log_dir, ignore_errors=True)
    print("\nmake test: " + ", ".join(
        f"{name} session exit {codes[name]} after {took[name] / 60:.1f} min"
        for name in ("cluster", "kwok", "local")), flush=True)
    if machine:
        print(machine, flush=True)
    if cpu:
        print(cpu, flush=True)
    slowest = _slowest(stamp)
    if slowest:
        print(slowest, flush=True)
    if built:
        print(built, flush=True)
    if failures:  # the end of the output is the local report: repeat the cluster sessions'
        print("cluster sessions' failures (their reports are above the local one):", flush=True)
        sys.stdout.buffer.write(b"".join(failures))
        sys.stdout.flush()
    return codes["cluster"] or codes["kwok"] or codes["local"]


def _slowest(stamp: str, n: int = 10, runs: Path | None = None) -> str:
    """The run's ``n`` slowest tests over the three sessions (setup, call and teardown: the
    JUnit XML's time), read from their reports: the lines .ci/README.md records per run, so
    that a regression shows in review."""
    import xml.etree.ElementTree as ET

    rows: list[tuple[float, str, str]] = []
    for xml in sorted((runs or RUNS_DIR).glob(f"{stamp}-*.xml")):
        session = xml.stem.removeprefix(f"{stamp}-")
        try:
            root = ET.parse(xml).getroot()
        except (OSError, ET.ParseError):
            continue
        for case in root.iter("testcase"):
            try:
                seconds = float(case.get("time") or 0)
            except ValueError:
                continue
            name = f"{case.get('classname', '')}::{case.get('name', '')}"
            rows.append((seconds, session, name))
    if not rows:
        return ""
    rows.sort(reverse=True)
    return f"slowest {min(n, len(rows))} tests (seconds, session, test):\n" + "\n".join(
        f"  {s:7.1f}  {session:7}  {name}" for s, session, name in rows[:n])


def _stop_cluster(root: Path) -> None:
    """The kwok session's control plane gone, with its directory. The session stops the one it
    started at its end; this is for a session cut short before it could (killed at CI's
    budget)."""
    from tests.cluster.controlplane import ControlPlane

    cp = ControlPlane(root)
    if cp.state_file.exists():
        with contextlib.suppress(Exception):
            cp.down()
    shutil.rmtree(root, ignore_errors=True)


def _background_build(log: Path, group: Path | None,
                      acct: Path | None = None) -> subprocess.Popen[bytes] | None:
    command = shlex.split(os.environ.get("SPYRE_BACKGROUND_BUILD", BACKGROUND_BUILD))
    if not command:
        return None
    with open(log, "wb") as out:
        # its own process group: stopped as a whole at the end, and not by the sessions' SIGINT
        # (Ctrl-C, .ci/run's budget), which would leave a half-built image to clean up
        # idle I/O too: a cold build writes bases and layers while the node imports images
        idle_io = ["ionice", "-c", "3"] if shutil.which("ionice") else []
        # idle CPU: a cgroup (nice alone weighs nothing against other sessions: background.py)
        niced = ["nice", "-n", str(BACKGROUND_NICENESS), *idle_io, *command]
        return subprocess.Popen(background.wrap(niced, group, acct),
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)


def _stop(build: subprocess.Popen[bytes] | None, group: Path | None, log: Path,
          start: float) -> str:
    """Stop the background build if it still runs; one line saying how it went."""
    if build is None:
        background.stop(group)
        return ""
    code = build.poll()
    if code is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(build.pid, signal.SIGTERM)
        try:
            build.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(build.pid, signal.SIGKILL)
            build.wait()
    background.stop(group)  # a step in a session of its own outlived the group
    where = (f"in the idle cgroup {group}" if group is not None
             else "with nice only (no writable cpu cgroup here)")
    if code == 0:
        return f"{BUILT}: done ({where})"
    if code is None:
        said, lines = (f"{BUILT}: still running after {(time.monotonic() - start) / 60:.1f} min "
                       f"({where}), stopped."), 6
    else:
        said, lines = (f"{BUILT} failed (exit {code}); the tests that need them built or "
                       "reported it."), 15
    tail = log.read_text(errors="replace").splitlines()[-lines:]
    return "\n".join([f"{said} Its last lines:", *tail])


def _relay(proc: subprocess.Popen[bytes], failures: list[bytes]) -> None:
    """Copy the cluster session's output to ours as it comes, keeping its FAILED/ERROR lines
    (pytest's short summary) to repeat at the end."""
    assert proc.stdout is not None
    for line in proc.stdout:
        sys.stdout.buffer.write(line)
        sys.stdout.buffer.flush()
        if line.startswith(FAILURE_LINES):
            failures.append(line)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
