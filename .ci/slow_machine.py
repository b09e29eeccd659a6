#!/usr/bin/env python3
"""Make this machine's CPUs N times slower for a measured run (issue 43: "≤ 70 min on a machine
twice as slow"), as root: one SCHED_FIFO busy loop pinned to each CPU, busy ``1 - 1/N`` of every
period, so every other task (the run, the real node's pods, the control plane) gets ``1/N`` of
each CPU. Unlike offlining a CPU or a cgroup limit, the machine keeps its CPU count (the
kubelet's allocatable, vLLM's thread count stay what they are) and nothing escapes the limit.
The kernel's RT throttling (``sched_rt_runtime_us``, 95%) is above what this asks for N ≤ 10.

It stops by itself at ``--until`` (seconds since the epoch) whatever happens to the run or to
the session that started it, and at once on SIGTERM/SIGINT:

    .ci/slow_machine.py --factor 2 --until $(( $(date +%s) + 100*60 )) &
    CI=true .ci/run; kill %1
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--factor", type=float, default=2.0, help="how many times slower (> 1)")
    p.add_argument("--period-ms", type=float, default=10.0)
    p.add_argument("--until", type=float, required=True, help="stop at this epoch time")
    a = p.parse_args()
    if a.factor <= 1:
        p.error("--factor must be above 1")
    period = a.period_ms / 1000
    busy = period * (1 - 1 / a.factor)
    children = []
    for cpu in sorted(os.sched_getaffinity(0)):
        pid = os.fork()
        if pid == 0:  # one per CPU, pinned, real-time: it runs whenever it wants to
            os.sched_setaffinity(0, {cpu})
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
            while time.time() < a.until:
                t = time.monotonic()
                while time.monotonic() - t < busy:
                    pass
                time.sleep(period - busy)
            os._exit(0)
        children.append(pid)

    def stop(*_: object) -> None:
        for child in children:
            try:
                os.kill(child, signal.SIGKILL)
            except ProcessLookupError:
                pass
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    for child in children:
        os.waitpid(child, 0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
