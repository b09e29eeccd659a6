"""tests/cluster/tcpforward.py: the real node's relay to the API server and CoreDNS.

A full run's relay held over 8,000 UDP sockets, and the number kept growing: a resolver sends
its A and AAAA queries back to back from one socket, both datagrams arrived before the first
one's upstream socket was open, each opened one, and the one the other replaced in the table
was never closed (nor expired)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

FORWARD = Path(__file__).resolve().parents[1] / "cluster" / "tcpforward.py"


def _udp_echo() -> tuple[socket.socket, int]:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                data, addr = s.recvfrom(2048)
            except OSError:
                return
            s.sendto(b"echo " + data, addr)

    threading.Thread(target=serve, daemon=True).start()
    return s, s.getsockname()[1]


def _sockets(pid: int) -> int:
    fds = Path(f"/proc/{pid}/fd")
    return sum(1 for fd in fds.iterdir() if os.readlink(fd).startswith("socket:"))


def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="counts sockets in /proc")
def test_back_to_back_datagrams_of_one_client_share_one_upstream_socket() -> None:
    echo, target = _udp_echo()
    listen = _free_udp_port()
    proc = subprocess.Popen([sys.executable, str(FORWARD), f"udp:127.0.0.1:{listen}",
                             f"127.0.0.1:{target}"], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and "forwarding" in proc.stdout.readline()
        base = _sockets(proc.pid)
        clients = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(20)]
        for c in clients:  # two queries each, back to back, as a resolver sends A and AAAA
            c.settimeout(10)
            c.sendto(b"A", ("127.0.0.1", listen))
            c.sendto(b"AAAA", ("127.0.0.1", listen))
        for c in clients:  # every answer comes back to the client that asked
            assert sorted(c.recvfrom(2048)[0] for _ in range(2)) == [b"echo A", b"echo AAAA"]
        opened = _sockets(proc.pid) - base
        assert opened == len(clients), f"{opened} upstream sockets for {len(clients)} clients"
        for c in clients:
            c.close()
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        echo.close()


def test_an_idle_clients_upstream_socket_is_closed() -> None:
    echo, target = _udp_echo()
    listen = _free_udp_port()
    env = {**os.environ, "SPYRE_UDP_IDLE_SECONDS": "0.5"}
    proc = subprocess.Popen([sys.executable, str(FORWARD), f"udp:127.0.0.1:{listen}",
                             f"127.0.0.1:{target}"], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None and "forwarding" in proc.stdout.readline()
        base = _sockets(proc.pid)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as c:
            c.settimeout(10)
            c.sendto(b"q", ("127.0.0.1", listen))
            assert c.recvfrom(2048)[0] == b"echo q"
            assert _sockets(proc.pid) == base + 1
            deadline = time.monotonic() + 10
            while _sockets(proc.pid) != base:
                assert time.monotonic() < deadline, "the idle upstream socket stayed open"
                time.sleep(0.1)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        echo.close()
