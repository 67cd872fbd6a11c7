"""The live path's trace read back (``engine.trace``): where each tick's time went, and where each repeat was late.

A benchmark sets ``DITTO_TRACE_DIR`` for the service it starts (``traced``), then ``summary(folder)`` reads every
process's file: the runtime's ticks (host wall and CPU, the GPU span on the host's clock, what each launched), the
publisher's takes and commits of each session's frames, the output workers' prepared frames and repeats. A repeat is
put down to the first stage its frame was late at, against the slot it should have filled: the GPU (the runtime had
not finished it: the publisher takes a frame once its GPU work is done), the publisher (its colour conversion and copy
into the ring), or the output worker (the frame reached it, or was prepared, after the slot). ``python -m
bench.common.trace DIR`` prints the summary as JSON.
"""

from __future__ import annotations

import bisect
import json
import os
import sys
from collections import Counter, defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.common.stats import summary as percentiles
from engine.trace import TRACE_DIR

NEAR_SECONDS = 0.3
"""The ticks listed beside a repeat: those that started up to this long before its slot."""
HOP_SECONDS = 0.2
"""The span the ticks' times are also added up over: a faithful session's hop (a window of every live session)."""


@contextmanager
def traced(folder: Path | None) -> Iterator[None]:
    """Within it, processes started inherit ``DITTO_TRACE_DIR=folder`` (nothing when ``folder`` is None)."""
    if folder is None:
        yield
        return
    folder.mkdir(parents=True, exist_ok=True)
    before = os.environ.get(TRACE_DIR)
    os.environ[TRACE_DIR] = str(folder)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(TRACE_DIR, None)
        else:
            os.environ[TRACE_DIR] = before


def records(folder: Path) -> dict[str, list[dict[str, Any]]]:
    """Every record in ``folder``'s trace files by kind, each kind in time order."""
    kinds: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for path in sorted(folder.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # the last line of a process killed mid-write
            kinds[record["k"]].append(record)
    for kind in kinds.values():
        kind.sort(key=lambda r: r["t"])
    return kinds


def summary(folder: Path, since: float | None = None, until: float | None = None) -> dict[str, Any]:
    """The ticks and repeats traced in ``folder`` between ``since`` and ``until`` (monotonic seconds; None: all)."""
    kinds = records(folder)

    def within(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [r for r in rows if (since is None or r["t"] >= since) and (until is None or r["t"] <= until)]

    ticks = within(kinds.get("tick", []))
    repeats = within(kinds.get("repeat", []))
    frames = _frames(kinds)
    repeated = [dict(repeat_detail(r, frames), near=_near(ticks, r["deadline"])) for r in repeats]
    return {
        "ticks": tick_profile(ticks),
        "live_margin_ms": margins(within(kinds.get("commit", [])), within(kinds.get("prepared", []))),
        "repeats": len(repeats),
        "repeats_by_stage": dict(Counter(r["stage"] for r in repeated)),
        "repeated": repeated,
        "worker_slow_messages": [
            {"at": round(r["t"], 3), "message": r["message"], "ms": r["ms"]}
            for r in within(kinds.get("slow_message", []))
        ],
        "render_files_opened_ms": [r["ms"] for r in within(kinds.get("render_file_opened", []))],
    }


def tick_profile(ticks: list[dict[str, Any]]) -> dict[str, Any]:
    """Host and GPU time of the ticks: the host's wall and CPU per tick, the GPU's span, how far the GPU's work
    started after the host began the tick (its queue), the GPU idle between ticks, and the GPU busy share."""
    if not ticks:
        return {"n": 0}
    gpu = [t for t in ticks if "gpu_from" in t]
    out: dict[str, Any] = {
        "n": len(ticks),
        "seconds": round(ticks[-1]["t"] - ticks[0]["t"], 3),
        "wall_ms": percentiles([t["wall"] for t in ticks]),
        "cpu_ms": percentiles([t["cpu"] for t in ticks]),
        "rows": _rows(ticks),
        "per_hop": per_hop(ticks),
    }
    if gpu:
        spans = sorted((t["gpu_from"], t["gpu_to"]) for t in gpu)
        busy, gaps, end = 0.0, [], spans[0][0]
        for lo, hi in spans:
            if lo > end:
                gaps.append((lo - end) * 1000)
            busy += max(0.0, hi - max(lo, end))
            end = max(end, hi)
        window = end - spans[0][0]
        out["gpu_ms"] = percentiles([t["gpu"] for t in gpu])
        out["gpu_start_after_host_ms"] = percentiles([(t["gpu_from"] - t["t"]) * 1000 for t in gpu])
        out["gpu_idle_gaps_ms"] = percentiles(gaps)
        out["gpu_idle_ms_total"] = round(sum(gaps), 1)
        out["gpu_busy"] = round(busy / window, 4) if window > 0 else None
    return out


def margins(commits: list[dict[str, Any]], prepared: list[dict[str, Any]]) -> dict[str, Any]:
    """How long before its clock showed it each live frame was committed to its ring (the first of each batch: the
    tightest) and prepared by its output: the headroom a hiccup of the GPU, the core or a worker eats into."""
    return {
        "committed": percentiles([(r["due"] - r["t"]) * 1000 for r in commits if r.get("due") is not None]),
        "prepared": percentiles([(r["due"] - r["t"]) * 1000 for r in prepared]),
    }


def per_hop(ticks: list[dict[str, Any]]) -> dict[str, Any]:
    """The ticks' host CPU, host wall and GPU time added up over each ``HOP_SECONDS`` from the first: what one hop of
    every session costs, and how much of it the host spends."""
    hops: dict[int, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    for tick in ticks:
        hop = hops[int((tick["t"] - ticks[0]["t"]) / HOP_SECONDS)]
        hop[0] += tick["cpu"]
        hop[1] += tick["wall"]
        hop[2] += tick.get("gpu", 0.0)
    whole = [hops[i] for i in sorted(hops)][1:-1]  # the first and last may be part hops
    return {
        "n": len(whole),
        "cpu_ms": percentiles([h[0] for h in whole]),
        "wall_ms": percentiles([h[1] for h in whole]),
        "gpu_ms": percentiles([h[2] for h in whole]),
    }


def _rows(ticks: list[dict[str, Any]]) -> dict[str, list[int]]:
    """Rows launched per stage over the ticks, [live, jobs]."""
    total: dict[str, list[int]] = {}
    for tick in ticks:
        for stage, (live, jobs) in tick.get("rows", {}).items():
            counts = total.setdefault(stage, [0, 0])
            counts[0] += live
            counts[1] += jobs
    return total


class _Frames:
    """Each session's frames' takes, commits and preparation, looked up by frame index."""

    def __init__(self) -> None:
        self.spans: dict[str, dict[str, list[tuple[int, int, dict[str, Any]]]]] = defaultdict(lambda: defaultdict(list))
        self.prepared: dict[tuple[str, int], dict[str, Any]] = {}

    def find(self, kind: str, session: str, index: int) -> dict[str, Any] | None:
        spans = self.spans[kind].get(session, [])
        at = bisect.bisect_right(spans, (index, float("inf"))) - 1
        if at >= 0 and spans[at][0] <= index < spans[at][0] + spans[at][1]:
            return spans[at][2]
        return None


def _frames(kinds: dict[str, list[dict[str, Any]]]) -> _Frames:
    frames = _Frames()
    for kind in ("take", "commit"):
        for record in kinds.get(kind, []):
            frames.spans[kind][record["s"]].append((record["i"], record["n"], record))
        for spans in frames.spans[kind].values():
            spans.sort(key=lambda span: (span[0], span[1]))
    for record in kinds.get("prepared", []):
        frames.prepared[(record["s"], record["i"])] = record
    return frames


def repeat_detail(repeat: dict[str, Any], frames: _Frames) -> dict[str, Any]:
    """A repeat and its frame's way: when the publisher took it (its GPU work done), committed it to the ring and the
    worker prepared it, each in ms after the slot it missed (negative: before it)."""
    times = repeat_times(repeat, frames)
    return {
        "session": repeat["s"],
        "frame": repeat["expected"],
        "slot_at": round(repeat["deadline"], 3),
        "shift_ms": round(repeat["shift"] * 1000, 1),
        **{f"{key}_ms": None if at is None else round(at * 1000, 2) for key, at in times.items()},
        "stage": blame(times),
    }


def blame(times: dict[str, float | None]) -> str:
    """The first stage at which a repeat's frame was past its slot (``repeat_times``): gpu, publisher, worker; release
    when it was in time at each (the release thread missed it), unknown where a stage was not traced."""
    for stage, key in (("gpu", "taken"), ("publisher", "committed"), ("worker", "prepared")):
        at = times[key]
        if at is None:
            return "unknown"
        if at > 0:
            return stage
    return "release"


def repeat_times(repeat: dict[str, Any], frames: _Frames) -> dict[str, float | None]:
    """Seconds after the repeat's slot that its frame was taken, committed and prepared (None: not traced)."""
    session, index = repeat["s"], repeat["expected"]
    stages = (
        ("taken", frames.find("take", session, index)),
        ("committed", frames.find("commit", session, index)),
        ("prepared", frames.prepared.get((session, index))),
    )
    return {key: None if record is None else record["t"] - repeat["deadline"] for key, record in stages}


def _near(ticks: list[dict[str, Any]], deadline: float) -> list[dict[str, Any]]:
    """The ticks that began within ``NEAR_SECONDS`` before ``deadline``, times in ms from it."""
    out = []
    for tick in ticks:
        if deadline - NEAR_SECONDS <= tick["t"] <= deadline:
            row = {"at_ms": round((tick["t"] - deadline) * 1000, 1), "wall": tick["wall"], "rows": tick.get("rows")}
            if "gpu_from" in tick:
                row["gpu_ms"] = [round((tick["gpu_from"] - deadline) * 1000, 1), round(tick["gpu"], 2)]
            row["slack"], row["queued"] = tick.get("slack"), tick.get("queued")
            out.append(row)
    return out


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m bench.common.trace TRACE_DIR", file=sys.stderr)
        return 2
    print(json.dumps(summary(Path(args[0])), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
