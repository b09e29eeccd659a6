"""A removed checkout's API forwarder (tcpforward.py, no pid file left) is found by the node
slot's address and stopped by the next `down` of that slot (tests/cluster/node.py
``forwarders_of``): one was left by a clone removed before `make cluster-down`, and the next
run's test_node counted it as its own node's leak."""

from __future__ import annotations

import subprocess
import sys

from tests.cluster.node import forwarders_of


def _fake_forwarder(*relays: str) -> subprocess.Popen[bytes]:
    # argv as the node starts it: the interpreter, tcpforward.py, LISTEN TARGET pairs
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)",
                             "/gone/tests/cluster/tcpforward.py", *relays])


def test_a_forwarder_of_the_slot_is_found_without_its_pid_file() -> None:
    mine = _fake_forwarder("10.250.77.1:28842", "127.0.0.1:28842",
                           "udp:10.250.77.1:25172", "127.0.0.1:25172")
    udp_only = _fake_forwarder("udp:10.250.78.1:53", "127.0.0.1:53")
    other = _fake_forwarder("10.250.77.10:28842", "127.0.0.1:28842")
    try:
        assert mine.pid in forwarders_of("10.250.77.1")
        assert other.pid not in forwarders_of("10.250.77.1")
        assert forwarders_of("10.250.78.1") == [udp_only.pid]
        assert other.pid in forwarders_of("10.250.77.10")
        mine.kill()
        mine.wait()
        assert mine.pid not in forwarders_of("10.250.77.1")
    finally:
        for p in (mine, udp_only, other):
            p.kill()
            p.wait()
