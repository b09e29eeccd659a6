"""The tests' port picks (spyre_engine.ports ``free_ports``, which the local cluster,
the test operators and engines use).

CoreDNS once failed to start ("listen udp 127.0.0.1:34703: bind: address already in use"): its
port was picked free for TCP only, from the kernel's ephemeral range, where clients' transient
sockets come and go. Operators of the kwok session later failed the same way for TCP
("[Errno 98] ... ('0.0.0.0', 35389): address already in use"). Every port is now picked outside
that range; one that carries UDP is free for both protocols."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

from spyre_engine import ports
from spyre_engine.ports import PICK_RANGE, free_port, free_ports


def _ephemeral() -> tuple[int, int]:
    low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
    return int(low), int(high)


def test_udp_ports_are_outside_the_ephemeral_range_and_free_for_both_protocols() -> None:
    low, high = _ephemeral()
    assert PICK_RANGE[1] < low, "the pick range must stay below the ephemeral range"
    ports = free_ports(4, udp=True)
    assert len(set(ports)) == 4
    for port in ports:
        assert not low <= port <= high and PICK_RANGE[0] <= port <= PICK_RANGE[1]
        for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
            with socket.socket(socket.AF_INET, kind) as s:
                s.bind(("127.0.0.1", port))


def test_tcp_ports_are_outside_the_ephemeral_range() -> None:
    """What the operators' metrics and health ports, the engines' and the cluster's are: a
    transient client socket never takes one between the pick and the bind."""
    low, high = _ephemeral()
    ports = [*free_ports(6), free_port()]
    assert len(set(ports)) == 7
    for port in ports:
        assert not low <= port <= high, (port, low, high)
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_a_port_taken_for_udp_is_never_picked(monkeypatch: Any) -> None:
    """The pick meets a port some socket holds for UDP only (free for TCP, as the CoreDNS port
    was): it is passed over."""
    port = next(p for p in range(*PICK_RANGE) if _free(p))
    picks = iter([port, port + 1])  # the first held for UDP, the next free
    monkeypatch.setattr(ports.random.Random, "randint", lambda self, a, b: next(picks))
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as blocker:
        blocker.bind(("127.0.0.1", port))
        assert free_ports(1, udp=True) == [port + 1]


def _free(port: int) -> bool:
    """``port`` and its neighbour are free for both protocols now."""
    for p in (port, port + 1):
        for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
            with socket.socket(socket.AF_INET, kind) as s:
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    return False
    return True
