"""A minimal DNS client (standard library only): one question over UDP, the response code and
the answers as text. Enough to ask the local cluster's CoreDNS from the host
(``ControlPlane.dns_query``); it is never pointed at anything but 127.0.0.1."""

from __future__ import annotations

import ipaddress
import secrets
import socket
import struct

QTYPES = {"A": 1, "NS": 2, "CNAME": 5, "SOA": 6, "PTR": 12, "TXT": 16, "AAAA": 28, "SRV": 33}
RCODES = {0: "NOERROR", 1: "FORMERR", 2: "SERVFAIL", 3: "NXDOMAIN", 4: "NOTIMP", 5: "REFUSED"}


def _encode_name(name: str) -> bytes:
    out = b""
    for label in name.rstrip(".").split("."):
        out += bytes([len(label)]) + label.encode()
    return out + b"\0"


def _read_name(msg: bytes, off: int) -> tuple[str, int]:
    """The (possibly compressed) name at ``off``; returns it and the offset after it."""
    labels: list[str] = []
    end = None
    for _ in range(128):  # bounded: a pointer loop cannot spin
        n = msg[off]
        if n & 0xC0 == 0xC0:
            if end is None:
                end = off + 2
            off = ((n & 0x3F) << 8) | msg[off + 1]
            continue
        if n == 0:
            return ".".join(labels) + ".", end if end is not None else off + 1
        labels.append(msg[off + 1: off + 1 + n].decode())
        off += 1 + n
    raise ValueError("DNS name compression loop")


def query(server: str, port: int, name: str, qtype: str = "A",
          timeout: float = 2.0) -> tuple[str, list[str]]:
    """Ask ``server:port`` for ``name`` (recursion desired, as a stub resolver asks).
    Returns (rcode name, answers): A/AAAA as addresses, PTR/CNAME as names, SRV as
    "priority weight port target", others as their type number and hex data."""
    qid = secrets.randbits(16)
    packet = struct.pack(">HHHHHH", qid, 0x0100, 1, 0, 0, 0)
    packet += _encode_name(name) + struct.pack(">HH", QTYPES[qtype], 1)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(timeout)
        s.sendto(packet, (server, port))
        while True:
            msg, _ = s.recvfrom(65535)
            if struct.unpack(">H", msg[:2])[0] == qid:
                break
    _, flags, qd, an, _, _ = struct.unpack(">HHHHHH", msg[:12])
    off = 12
    for _ in range(qd):
        _, off = _read_name(msg, off)
        off += 4
    answers = []
    for _ in range(an):
        _, off = _read_name(msg, off)
        rtype, _, _, rdlen = struct.unpack(">HHIH", msg[off: off + 10])
        off += 10
        rdata = msg[off: off + rdlen]
        if rtype in (1, 28):
            answers.append(str(ipaddress.ip_address(rdata)))
        elif rtype in (5, 12):
            answers.append(_read_name(msg, off)[0])
        elif rtype == 33:
            prio, weight, srv_port = struct.unpack(">HHH", rdata[:6])
            answers.append(f"{prio} {weight} {srv_port} {_read_name(msg, off + 6)[0]}")
        else:
            answers.append(f"{rtype} {rdata.hex()}")
        off += rdlen
    return RCODES.get(flags & 0xF, str(flags & 0xF)), answers
