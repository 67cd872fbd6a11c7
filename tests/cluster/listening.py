"""The TCP sockets a tree of processes listens on, read from /proc (no psutil): for the loopback-only checks."""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path

LISTEN = "0A"


def descendants(root: int) -> set[int]:
    """``root`` and every process below it."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = set(), [root]
    while todo:
        pid = todo.pop()
        found.add(pid)
        todo.extend(children.get(pid, ()))
    return found


def listening(pids: set[int]) -> list[tuple[int, str, int]]:
    """(pid, address, port) of every TCP socket (IPv4 and IPv6) these processes listen on."""
    sockets: dict[str, tuple[str, int]] = {}
    for table, _width in (("/proc/net/tcp", 4), ("/proc/net/tcp6", 16)):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            if parts[3] != LISTEN:
                continue
            address, port = parts[1].split(":")
            raw = bytes.fromhex(address)
            # /proc writes each 32-bit word in host (little-endian) order
            raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
            sockets[parts[9]] = (str(ipaddress.ip_address(raw)), int(port, 16))
    found = []
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:[") and target[8:-1] in sockets:
                found.append((pid, *sockets[target[8:-1]]))
    return found


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address, an IPv4 one mapped on an IPv6 socket (as gRPC binds 127.0.0.1) too."""
    address = ipaddress.ip_address(host)
    return (getattr(address, "ipv4_mapped", None) or address).is_loopback


def beyond_loopback(pids: set[int]) -> list[tuple[int, str, int]]:
    """The listening sockets of ``pids`` that are not bound to a loopback address."""
    return [(pid, host, port) for pid, host, port in listening(pids) if not is_loopback(host)]
