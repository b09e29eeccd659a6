"""CPU for the background build (tests/streams.py) that nothing else wants: a cgroup.

``nice -n 19`` alone did not keep it there. With the kernel's autogroups
(``/proc/sys/kernel/sched_autogroup_enabled``, on by default), nice weighs a process only
against the others of its session; every session (``setsid``) gets an equal share of the CPU
against every other. The build ran in a session of its own, and so did whatever it ran in one
(a build step's container): at nice 19 it took as much CPU as both test sessions together, and
a cold run's every test took two to three times its time (.ci/README.md). Measured here: four
busy loops on two cores, two at nice 19 in a new session, took 2/3 of the CPU.

A cgroup holds every descendant whatever its session. Its ``cpu.idle`` (Linux 5.15) makes it
run only on a CPU nothing else wants (its weight the lowest otherwise). A test that needs what
the build makes and waits for it (its script's lock) lifts that for as long as it waits
(:func:`needed`): a build nobody waits for never slows a test, and one a test waits for is
not starved by the other session.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

#: The variable naming the cgroup for the sessions' tests (:func:`needed`).
ENV = "SPYRE_BACKGROUND_CGROUP"
CGROUP_ROOT = Path("/sys/fs/cgroup")


def _own_cgroups() -> list[tuple[str, str]]:
    """This process's cgroups: (controllers, path relative to the hierarchy's root), as
    /proc/self/cgroup lists them (v2's one with controllers "")."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return []
    return [(controllers, path.lstrip("/"))
            for _, controllers, path in (line.split(":", 2) for line in lines)]  # fmt: skip


def _own_cpu_cgroup(root: Path) -> Path | None:
    """This process's cgroup that has the ``cpu`` controller (v1 or v2), or None."""
    for controllers, rel in _own_cgroups():
        if "cpu" in controllers.split(","):  # v1: the cpu hierarchy (maybe "cpu,cpuacct")
            for mount in (root / controllers, root / "cpu", root / "cpu,cpuacct"):
                if (mount / "cpu.shares").exists() or (mount / rel / "cpu.shares").exists():
                    return mount / rel
        if controllers == "" and (root / "cgroup.controllers").exists():  # v2
            group = root / rel
            with contextlib.suppress(OSError):
                if "cpu" in (group / "cgroup.subtree_control").read_text().split():
                    return group
    return None


def cgroup(root: Path = CGROUP_ROOT, name: str = "background",
           shares: int | None = None) -> Path | None:
    """A cgroup under this process's own (created; named for its use and this process: a toy
    run in the unit tests has its own), idle or, with ``shares``, of that weight (cgroup v1's
    cpu.shares, 1024 a normal one), or None when this machine gives none (not root, no cpu
    controller): what runs in it then has only its nice."""
    parent = _own_cpu_cgroup(root)
    if parent is None:
        return None
    group = parent / f"spyre-{name}-{os.getpid()}"
    try:
        group.mkdir(exist_ok=True)
        if shares is None:
            _set_idle(group, True)
        else:
            _set_weight(group, shares)
    except OSError:
        return None
    return group


def _set_idle(group: Path, idle: bool) -> None:
    if (group / "cpu.idle").exists():
        (group / "cpu.idle").write_text("1" if idle else "0")
    else:  # before cpu.idle: the lowest weight
        _set_weight(group, 2 if idle else 1024)


def _set_weight(group: Path, shares: int) -> None:
    """``shares`` in cgroup v1's scale (1024 a normal weight; v2's cpu.weight: 100)."""
    if (group / "cpu.shares").exists():
        (group / "cpu.shares").write_text(str(shares))
    else:
        (group / "cpu.weight").write_text(str(max(1, shares * 100 // 1024)))


def wrap(command: list[str], *groups: Path | None) -> list[str]:
    """``command`` started inside each of ``groups`` (one per hierarchy; None: left out)."""
    procs = [str(g / "cgroup.procs") for g in groups if g is not None]
    if not procs:
        return command
    script = 'for g in "$@"; do [ "$g" = -- ] && break; echo $$ > "$g" || exit 1; done; ' \
        'while [ "$1" != -- ]; do shift; done; shift; exec "$@"'
    return ["sh", "-c", script, "sh", *procs, "--", *command]


def accounting(name: str, root: Path = CGROUP_ROOT) -> Path | None:
    """A group of cgroup v1's ``cpuacct`` hierarchy, when it is one of its own (as on this
    project's machines): it counts the CPU of everything started in it, whatever its session,
    and changes nobody's share of the CPU. None elsewhere (cpuacct mounted with cpu, or v2:
    a group there would be a scheduling group too)."""
    for controllers, rel in _own_cgroups():
        if controllers.split(",") == ["cpuacct"] and (root / "cpuacct" / "cpuacct.usage").exists():
            group = root / "cpuacct" / rel / f"spyre-{name}-{os.getpid()}"
            try:
                group.mkdir(exist_ok=True)
            except OSError:
                return None
            return group
    return None


def usage_ns(group: Path | None) -> int | None:
    """CPU nanoseconds used in ``group`` and below (cpuacct.usage, or v2's cpu.stat)."""
    if group is None:
        return None
    with contextlib.suppress(OSError, ValueError, IndexError):
        if (group / "cpuacct.usage").exists():
            return int((group / "cpuacct.usage").read_text())
        stat = (group / "cpu.stat").read_text()
        return int(stat.split("usage_usec", 1)[1].split()[0]) * 1000
    return None


def release(group: Path | None) -> None:
    """An accounting group removed, what still runs in it (a control plane left up on
    purpose) moved back to its parent first: nothing is killed."""
    if group is None:
        return
    with contextlib.suppress(OSError, ValueError):
        for pid in (group / "cgroup.procs").read_text().split():
            with contextlib.suppress(OSError):
                (group.parent / "cgroup.procs").write_text(pid)
    with contextlib.suppress(OSError):
        group.rmdir()


def stop(group: Path | None) -> None:
    """Whatever still runs in the cgroup killed (a build step in a session of its own outlives
    its process group's signal), then the cgroup removed."""
    if group is None:
        return
    for _ in range(50):
        try:
            pids = [int(p) for p in (group / "cgroup.procs").read_text().split()]
        except OSError:
            return
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)
    with contextlib.suppress(OSError):
        group.rmdir()


@contextlib.contextmanager
def needed() -> Iterator[None]:
    """While a test waits for what the background build makes: the build at a normal weight.
    The build's cgroup is the one ``make test`` named in the environment (none: a no-op)."""
    name = os.environ.get(ENV)
    group = Path(name) if name else None
    if group is not None and group.is_dir():
        with contextlib.suppress(OSError):
            _set_idle(group, False)
    try:
        yield
    finally:
        if group is not None and group.is_dir():
            with contextlib.suppress(OSError):
                _set_idle(group, True)
