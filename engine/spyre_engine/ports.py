"""Ports a process picks for itself and binds later: vLLM's internal port behind the engine's
proxy, torch's MASTER_PORT, the tests' clusters, operators and engines.

A port picked free with ``bind(0)`` comes from the kernel's ephemeral range, from which every
client's outgoing socket takes its source port too; in the seconds before its owner binds it (a
model load, for vLLM), a connection can take it. So ports are picked at random below that range,
where no transient socket lands. Imports nothing of the engine."""

from __future__ import annotations

import random
import socket
from pathlib import Path

#: Where ports are picked: below the kernel's ephemeral range (32768-60999 by default),
#: from which every client's transient socket takes its source port. A port picked free there
#: and bound seconds later can be a client's by then: CoreDNS failed to start once ("listen udp
#: 127.0.0.1:34703: bind: address already in use"), and so did operators of the kwok session
#: ("[Errno 98] ... ('0.0.0.0', 35389): address already in use", kopf retrying only after 60 s).
PICK_RANGE = (20000, 32767)


def pick_range() -> tuple[int, int]:
    """PICK_RANGE, narrowed to stay below this machine's ephemeral range."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    return PICK_RANGE[0], min(PICK_RANGE[1], low - 1)


def free_ports(n: int, udp: bool = False) -> list[int]:
    """``n`` distinct ports free on 127.0.0.1 for TCP (with ``udp``, for TCP and UDP alike),
    picked at random outside the ephemeral range (``pick_range``). Held until all are picked,
    so no two are the same; a port some process holds is passed over."""
    first, last = pick_range()
    if last - first < 100 * n:  # an ephemeral range reaching down here: take the kernel's pick
        first, last = 0, 0
    kinds = (socket.SOCK_STREAM, socket.SOCK_DGRAM) if udp else (socket.SOCK_STREAM,)
    socks: list[socket.socket] = []
    ports: list[int] = []
    rng = random.Random()
    try:
        while len(ports) < n:
            port = rng.randint(first, last) if last else 0
            pair = [socket.socket(socket.AF_INET, kind) for kind in kinds]
            try:
                for s in pair:
                    s.bind(("127.0.0.1", port))
                    port = s.getsockname()[1]  # the kernel's, when it picked (port 0)
            except OSError:
                for s in pair:
                    s.close()
                continue
            socks += pair
            ports.append(port)
        return ports
    finally:
        for s in socks:
            s.close()


def free_port() -> int:
    """A TCP port free right now on 127.0.0.1, outside the ephemeral range (``free_ports``)."""
    return free_ports(1)[0]
