"""GPU memory as a benchmark reports it: what torch's caching allocator holds, by pool, and what the process holds.

The process's figure is what ``nvidia-smi`` reports for it (the CUDA context, loaded kernels and every allocator's
memory); torch's are what its allocator reserved (cudaMalloc'd segments) and allocated (held by tensors), split into
the default pool and the pools of captured CUDA graphs.
"""

from __future__ import annotations

import os
import subprocess

import torch

GIB = 2**30


def gib(nbytes: float) -> float:
    """Bytes in GiB, rounded for a table."""
    return round(nbytes / GIB, 3)


def process_used(pid: int | None = None) -> int | None:
    """Bytes of GPU memory ``nvidia-smi`` counts for ``pid`` (this process by default); None where it cannot say."""
    used = used_by_process()
    return None if used is None else used.get(os.getpid() if pid is None else pid)


def used_by_process() -> dict[int, int] | None:
    """Bytes of GPU memory ``nvidia-smi`` counts for each process holding some; None where it cannot say."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    used = {}
    for line in out.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) == 2 and fields[0].isdigit() and fields[1].isdigit():
            used[int(fields[0])] = int(fields[1]) * 2**20
    return used


def pools(device: torch.device) -> dict[str, dict[str, float]]:
    """Reserved and allocated GiB per allocator pool: ``default``, and each graph pool by its id."""
    table: dict[str, dict[str, float]] = {}
    for segment in torch.cuda.memory._snapshot(device)["segments"]:
        pool = tuple(segment.get("segment_pool_id", (0, 0)))
        name = "default" if pool == (0, 0) else f"graphs {pool[0]}.{pool[1]}"
        row = table.setdefault(name, {"reserved": 0, "allocated": 0})
        row["reserved"] += segment["total_size"]
        row["allocated"] += segment["allocated_size"]
    return {name: {k: gib(v) for k, v in row.items()} for name, row in sorted(table.items())}


def memory(device: torch.device) -> dict[str, float | None]:
    """This process's GPU memory now, in GiB: torch's allocated and reserved (and their peaks), the device's used,
    the process's per ``nvidia-smi``, and beside torch's reserve the rest (context, kernels, other allocators)."""
    torch.cuda.synchronize(device)
    free, total = torch.cuda.mem_get_info(device)
    used = process_used()
    reserved = torch.cuda.memory_reserved(device)
    return {
        "allocated": gib(torch.cuda.memory_allocated(device)),
        "reserved": gib(reserved),
        "max_allocated": gib(torch.cuda.max_memory_allocated(device)),
        "max_reserved": gib(torch.cuda.max_memory_reserved(device)),
        "device_used": gib(total - free),
        "process_nvidia_smi": None if used is None else gib(used),
        "outside_torch": None if used is None else gib(used - reserved),
    }
