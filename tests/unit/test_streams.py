"""``make test``'s three pytest sessions (tests/streams.py): every test runs in one of them, every
report reaches the output, the exit status says a failure in any, Ctrl-C stops them all."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import streams
from tests.cluster import background, fixtures

ROOT = Path(__file__).resolve().parents[2]

CONFTEST = '''
import pytest

pytest_plugins = ["tests.cluster.watchdog"]  # names each session's running test


def pytest_collection_modifyitems(items):
    for item in items:
        if any(f"/{d}/" in str(item.fspath) for d in ("integration", "contract", "realpods")):
            item.add_marker(pytest.mark.integration)
        if any(f"/{d}/" in str(item.fspath) for d in ("contract", "realpods")):
            item.add_marker(pytest.mark.node)  # the real tree: modules using the real node
'''


def test_every_integration_test_is_in_the_cluster_session() -> None:
    """The local session leaves ``integration`` tests out by marker; the cluster session
    collects only its folders: an ``integration`` test elsewhere would run in neither."""
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--collect-only", "-q",
         "-m", "integration", "tests"], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    ids = [line for line in r.stdout.splitlines() if "::" in line]
    assert ids, r.stdout
    outside = [i for i in ids if not i.startswith(tuple(d + "/" for d in streams.CLUSTER_DIRS))]
    assert outside == []


def test_the_image_tests_run_in_the_local_session() -> None:
    """They need no cluster (buildah and the images' root filesystems): off the cluster
    session, the run's critical path. Collected by the local session's own selection."""
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--collect-only", "-q",
         "-m", streams.LOCAL[streams.LOCAL.index("-m") + 1], "tests/integration"],
        capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    modules = {line.split("::")[0] for line in r.stdout.splitlines() if "::" in line}
    assert modules == {"tests/integration/test_engine_index.py",
                       "tests/integration/test_images.py",
                       "tests/integration/test_layer_image.py",
                       "tests/integration/test_reproducible.py"}, sorted(modules)


def test_the_modules_needing_the_background_build_run_last_in_the_cluster_session() -> None:
    """On a cold machine they wait for the background build (tests/streams.py): KEDA for the
    scale-to-zero modules; those publishing a release come after them. Every other test runs
    first; each of these modules runs whole (its module fixtures are set up once), KEDA's
    before the release's."""
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--collect-only", "-q",
         *streams.CLUSTER], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    modules = [line.split("::")[0] for line in r.stdout.splitlines() if "::" in line]
    keda = ["tests/integration/test_keda.py", "tests/realpods/test_scale_to_zero.py"]
    releasing = ["tests/integration/test_chart_pod.py", "tests/integration/test_readme_install.py"]
    late = keda + releasing
    assert list(dict.fromkeys(modules))[-len(late):] == late, list(dict.fromkeys(modules))
    n = sum(m in late for m in modules)
    assert modules[-n:] == sorted(modules[-n:], key=late.index), modules[-n:]
    assert all(m in late for m in modules[-n:]), modules[-n:]


def test_keda_is_built_in_the_background_and_no_other_architecture_at_all() -> None:
    """The order the later modules need them (the adapter for the real-node autoscaling module,
    KEDA for the scale-to-zero ones): a cold set-up without KEDA's ~7 minutes nor the adapter's
    ~1.5 (Prometheus itself stays: the local session's dashboard test runs it). No qemu build
    anywhere in make test (issue 43: ~12 min per architecture cold, on CI's critical path):
    neither in the background nor in the set-up."""
    command = streams.BACKGROUND_BUILD
    assert 0 < command.index("metrics-deps.sh") < command.index("keda-deps.sh"), command
    assert "platforms" not in command, command
    make = subprocess.run(["make", "-n", "deps"], capture_output=True, text=True, cwd=ROOT,
                          timeout=60)
    assert make.returncode == 0, make.stderr
    assert "keda-deps.sh" not in make.stdout and "build.sh" in make.stdout, make.stdout
    assert "build.sh platforms" not in make.stdout, make.stdout
    metrics = [line for line in make.stdout.splitlines() if "metrics-deps.sh" in line]
    assert metrics and all("--prometheus-only" in line for line in metrics), metrics


def _tree(tmp_path: Path, kwok_test: str, local_test: str,
          node_test: str = "def test_c():\n    pass\n") -> None:
    """A toy tests/: integration's test runs in the kwok session, contract's and realpods' in
    the real-node ("cluster") one, unit's in the local one."""
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "conftest.py").write_text(CONFTEST)
    for folder, body in (("integration", kwok_test), ("contract", node_test),
                         ("realpods", "def test_r():\n    pass\n"), ("unit", local_test)):
        (tmp_path / "tests" / folder).mkdir()
        (tmp_path / "tests" / folder / f"test_{folder}.py").write_text(body)


def _run(tmp_path: Path, build: str = "", **kw: object) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SPYRE_BACKGROUND_BUILD": build,
           "XDG_CACHE_HOME": str(tmp_path / "cache"),
           "SPYRE_CURRENT_TEST_FILE": str(tmp_path / "current")}
    return subprocess.Popen([sys.executable, str(ROOT / "tests" / "streams.py")], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, **kw)


def _reports(out: str) -> tuple[str, str, str]:
    """The real-node session's output (streamed), the kwok session's and the local one's."""
    cluster, _, rest = out.partition("kwok tests (the control plane without the real node;")
    kwok, _, local = rest.partition("local tests (unit, golden, images, engine;")
    return cluster, kwok, local


def _running(tmp_path: Path, session: str) -> str:
    try:
        return (tmp_path / f"current.{session}").read_text()
    except FileNotFoundError:
        return ""


def test_every_session_reports_and_a_failure_in_any_fails_the_run(tmp_path: Path) -> None:
    _tree(tmp_path, "def test_i():\n    pass\n", "def test_u():\n    assert 1 == 2\n")
    proc = _run(tmp_path)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 1, out
    cluster, kwok, local = _reports(out)
    # the real-node session's tests (contract, realpods), streamed first ...
    assert "2 passed" in cluster and "test_integration" not in cluster, out
    assert "test_unit" not in cluster, out
    # ... then the kwok session's report (integration's kwok-only modules), whole ...
    assert "1 passed" in kwok and "test_integration.py" in kwok and "test_contract" not in kwok
    # ... then the local session's
    assert "FAILED tests/unit/test_unit.py::test_u" in local and "1 failed" in local, out
    assert ("cluster session exit 0" in out and "kwok session exit 0" in out
            and "local session exit 1" in out), out
    # where the machine's CPU went (a slow CI run says why), and each session's timings kept
    tail = out.partition("make test: ")[2]
    assert "machine over the run" in tail and "steal" in tail, out
    runs = tmp_path / "cache" / "spyre-model-operator" / "runs"
    assert sorted(p.name.rsplit("-", 1)[1] for p in runs.glob("*.xml")) == [
        "cluster.xml", "kwok.xml", "local.xml"], list(runs.iterdir())


def test_the_run_says_where_its_cpu_went_by_session(tmp_path: Path) -> None:
    """Issue 43: a run twice as slow is CPU-bound, and what to cut is what uses the CPU: the
    last lines give each session's core-minutes, the real node's and the rest. A local test
    spins 1.5 s of CPU in a child it waits for; with cpuacct groups (this project's machines)
    another 1.5 s in a process it leaves to init, as a control plane is: counted too."""
    counted = background.accounting("probe")
    background.release(counted)
    spin = "import time\nt = time.process_time()\nwhile time.process_time() - t < 1.5: pass\n"
    (tmp_path / "spin.py").write_text(spin + "open(__file__ + '.done', 'w').close()\n")
    body = ("import subprocess, sys, time\nfrom pathlib import Path\n\ndef test_u():\n"
            f"    spin = {str(tmp_path / 'spin.py')!r}\n"
            "    subprocess.run([sys.executable, spin], check=True)\n")
    if counted is not None:
        body += ("    Path(spin + '.done').unlink()\n"
                 "    subprocess.run(['sh', '-c', f'({sys.executable} {spin} &)'], check=True)\n"
                 "    while not Path(spin + '.done').exists():\n        time.sleep(0.1)\n")
    _tree(tmp_path, "def test_i():\n    pass\n", body)
    proc = _run(tmp_path)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    [line] = [ln for ln in out.splitlines() if ln.startswith("CPU used over the run: ")]
    shares = dict(part.rsplit(" ", 1) for part in line.split(" core-min: ", 1)[1].split(", "))
    assert {"cluster session", "kwok session", "local session", "real node (its cgroup)",
            "the rest"} <= set(shares) <= {"cluster session", "kwok session", "local session",
                                           "background build", "real node (its cgroup)",
                                           "the rest"}, line
    spun = 3.0 if counted is not None else 1.5
    assert float(shares["local session"]) >= spun / 60 - 0.005, line
    assert float(shares["local session"]) > float(shares["kwok session"]), line


def test_the_real_nodes_cpu_is_read_from_its_cgroup_in_either_hierarchy(tmp_path: Path) -> None:
    (tmp_path / "cpuacct" / "spyre-node-0").mkdir(parents=True)
    (tmp_path / "cpuacct" / "spyre-node-0" / "cpuacct.usage").write_text("5000000000\n")
    (tmp_path / "spyre-node-1").mkdir()
    (tmp_path / "spyre-node-1" / "cpu.stat").write_text("usage_usec 2000000\nuser_usec 1\n")
    (tmp_path / "cpuacct" / "other").mkdir()
    (tmp_path / "cpuacct" / "other" / "cpuacct.usage").write_text("7\n")
    assert streams._node_cpu_ns(tmp_path) == {"spyre-node-0": 5 * 10**9,
                                              "spyre-node-1": 2 * 10**9}
    line = streams._cpu_shares(180 * 10**9, {"build": 30 * 10**9, "local": 30 * 10**9},
                               60 * 10**9)
    assert line == ("CPU used over the run: 3.00 core-min: local session 0.50, "
                    "background build 0.50, real node (its cgroup) 1.00, the rest 1.00"), line


def test_ctrl_c_stops_every_session_and_prints_every_report(tmp_path: Path) -> None:
    hang = "import time\n\ndef test_hangs():\n    time.sleep(600)\n"
    _tree(tmp_path, hang, hang, hang)
    proc = _run(tmp_path, start_new_session=True)
    deadline = time.monotonic() + 120
    while not all("test_hangs" in _running(tmp_path, s) for s in ("cluster", "kwok", "local")):
        assert time.monotonic() < deadline and proc.poll() is None, "the sessions never started"
        time.sleep(0.5)
    time.sleep(1)  # from "started" to inside time.sleep
    os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C, or .ci/run at its budget
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 2, out  # pytest's "interrupted"
    assert out.count("KeyboardInterrupt") >= 3, out
    assert "tests/contract/test_contract.py:4" in out, out
    assert "tests/integration/test_integration.py:4" in out, out
    assert "tests/unit/test_unit.py:4" in out, out


def test_ci_run_names_the_test_still_running_at_its_budget(tmp_path: Path) -> None:
    """``.ci/run`` at its budget names the running test of each session still running; the
    real-node and local sessions, finished by then, name none."""
    _tree(tmp_path, "import time\n\ndef test_hangs():\n    time.sleep(600)\n",
          "def test_quick():\n    pass\n")
    # .ci/run changes to the repository's root: the sessions run in the toy tree
    command = f"env -C {tmp_path} {sys.executable} {ROOT / 'tests' / 'streams.py'}"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SPYRE_CI_BUDGET": "45s",
           "SPYRE_CI_COMMAND": command, "SPYRE_BACKGROUND_BUILD": "",
           "XDG_CACHE_HOME": str(tmp_path / "cache")}  # its timings not among the real runs'
    real_runs = set(streams.RUNS_DIR.glob("*.xml"))
    r = subprocess.run([str(ROOT / ".ci" / "run")], capture_output=True, text=True, env=env,
                       timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode == 124, out
    running = out.partition("Running at the time: ")[2]
    assert running.startswith("tests/integration/test_integration.py::test_hangs (started"), out
    assert set(streams.RUNS_DIR.glob("*.xml")) <= real_runs, "a toy run wrote the real timings"
    assert "test_quick" not in running, out
    assert ("local session exit 0" in out and "cluster session exit 0" in out
            and "kwok session exit 2" in out), out


def test_the_cluster_sessions_failures_are_repeated_at_the_end(tmp_path: Path) -> None:
    _tree(tmp_path, "def test_i():\n    assert 'kwok' == 'ok'\n", "def test_u():\n    pass\n",
          "def test_c():\n    assert 'node' == 'ok'\n")
    proc = _run(tmp_path)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 1, out
    tail = out.partition("make test: ")[2]
    assert ("local session exit 0" in tail and "cluster session exit 1" in tail
            and "kwok session exit 1" in tail), out
    assert "FAILED tests/contract/test_contract.py::test_c" in tail, out
    assert "FAILED tests/integration/test_integration.py::test_i" in tail, out


def test_the_kwok_session_runs_on_a_control_plane_of_its_own_and_leaves_no_directory(
        tmp_path: Path) -> None:
    """The kwok session's control plane lives under a directory of its own (the control-plane
    fixture's ``SPYRE_CLUSTER_ROOT``, tests/cluster/fixtures.py), the real-node session's under
    the checkout; the directory goes with the run."""
    seen = tmp_path / "kwok-root"
    kwok = ("import os, pathlib\n"
            "def test_i():\n"
            "    root = os.environ['SPYRE_CLUSTER_ROOT']\n"
            "    assert os.path.isdir(root)\n"
            f"    pathlib.Path({str(seen)!r}).write_text(root)\n")
    node = ("import os\n"
            "def test_c():\n"
            "    assert 'SPYRE_CLUSTER_ROOT' not in os.environ\n")
    _tree(tmp_path, kwok, "def test_u():\n    pass\n", node)
    proc = _run(tmp_path)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    root = Path(seen.read_text())
    assert not root.is_relative_to(tmp_path), root  # not the checkout's .cluster
    assert not root.exists(), f"{root} was left behind"
    assert streams.KWOK_ROOT_ENV == fixtures.ROOT_ENV


def test_the_background_build_is_stopped_with_the_sessions_and_said(tmp_path: Path) -> None:
    """The other architectures' operator image builds beside the sessions (nice 19, a process
    group of its own); still running when they end, it is stopped, and the run says so with its
    last lines (how far it got: CI shows only the end of the output)."""
    _tree(tmp_path, "def test_i():\n    pass\n", "def test_u():\n    pass\n")
    pidfile = tmp_path / "build.pid"
    build = f"sh -c 'echo $$ > {pidfile}; echo its-last-words; exec sleep 600'"
    proc = _run(tmp_path, build=build)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    assert f"{streams.BUILT}: still running" in out, out
    assert "its-last-words" in out.partition("still running")[2], out
    pid = int(pidfile.read_text())
    assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(
        f"/proc/{pid}/status").read_text(), "the background build was left running"


def test_a_failed_background_build_is_reported_without_failing_the_run(tmp_path: Path) -> None:
    """The release tests build what is missing themselves (and fail if it cannot be built):
    the background build's own failure is shown, not counted twice."""
    _tree(tmp_path, "def test_i():\n    pass\n", "def test_u():\n    pass\n")
    proc = _run(tmp_path, build="sh -c 'echo no-qemu-here; exit 3'")
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    assert f"{streams.BUILT} failed (exit 3)" in out, out
    assert "no-qemu-here" in out.partition("failed (exit 3)")[2], out


def test_the_background_build_runs_in_an_idle_cgroup_and_nothing_of_it_outlives_the_run(
        tmp_path: Path) -> None:
    """The build and whatever it starts in a session of its own (a build step's container) run
    in a cgroup that gets only CPU nothing else wants: with autogroups, nice 19 in another
    session took more CPU than both test sessions (tests/cluster/background.py). A test waiting
    for the build lifts that while it waits. At the end nothing of it is left, the cgroup
    neither."""
    if background.cgroup() is None:  # made here only to ask whether the machine has one
        pytest.skip("no writable cpu cgroup on this machine (not root?)")
    background.stop(background.cgroup())
    waits = ("import os, pathlib\n"
             "from tests.cluster import background\n"
             "group = pathlib.Path(os.environ[background.ENV])\n"
             "def idle():\n"
             "    return (group / 'cpu.idle').read_text().strip()\n"
             "def test_waits():\n"
             "    assert idle() == '1'\n"
             "    with background.needed():\n"
             "        assert idle() == '0'\n"
             "    assert idle() == '1'\n")
    # The local session runs in a cgroup of its own at a low weight (nice weighs nothing
    # against the real node's cgroup, nor against the sessions its engines start).
    local = ("import pathlib, re\n"
             "def test_u():\n"
             "    own = pathlib.Path('/proc/self/cgroup').read_text()\n"
             "    assert re.search(r'[:,]cpu[,:].*/spyre-local-[0-9]+$|^0::.*/spyre-local-', own,"
             " re.M), own\n")
    _tree(tmp_path, waits, local)
    inner = tmp_path / "inner.pid"
    build = (f"sh -c 'grep -E \"^[0-9]+:[^:]*cpu[,:]\" /proc/self/cgroup > {tmp_path}/cg; "
             f"setsid sh -c \"echo \\$\\$ > {inner}; exec sleep 600\" & exec sleep 600'")
    proc = _run(tmp_path, build=build)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    assert "1 passed" in _reports(out)[1], out  # test_waits, in the kwok session
    cgroup = (tmp_path / "cg").read_text().strip().rsplit(":", 1)[1]
    assert Path(cgroup).name == f"spyre-background-{proc.pid}", cgroup
    pid = int(inner.read_text())
    assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(
        f"/proc/{pid}/status").read_text(), "a step in a session of its own was left running"
    assert "1 passed" in _reports(out)[2], out  # in its cgroup
    assert not any(Path("/sys/fs/cgroup").glob(f"*/spyre-*-{proc.pid}")), "a cgroup was left"


def test_the_runs_last_lines_name_its_slowest_tests(tmp_path: Path) -> None:
    """Issue 43: each run's ten slowest tests over the three sessions, from their JUnit XML,
    for .ci/README.md's record of the run."""
    def xml(cases: list[tuple[str, float]]) -> str:
        return "<testsuites><testsuite>" + "".join(
            f'<testcase classname="tests.m" name="{n}" time="{s}"/>' for n, s in cases
        ) + "</testsuite></testsuites>"

    (tmp_path / "S-cluster.xml").write_text(xml([("slow", 300.5), ("quick", 1.0)]))
    (tmp_path / "S-local.xml").write_text(xml([("mid", 42.0)]))
    (tmp_path / "S-kwok.xml").write_text("<not xml")
    (tmp_path / "T-cluster.xml").write_text(xml([("other run", 999.0)]))
    out = streams._slowest("S", n=2, runs=tmp_path).splitlines()
    assert out[0].startswith("slowest 2 tests"), out
    assert "300.5" in out[1] and "cluster" in out[1] and "tests.m::slow" in out[1], out
    assert "42.0" in out[2] and "local" in out[2] and "tests.m::mid" in out[2], out
    assert len(out) == 3 and streams._slowest("none", runs=tmp_path) == ""
