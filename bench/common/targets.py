"""The targets docs/benchmarks.md lists, the one place the benchmarks' tables read them from."""

LMDM_WINDOW_MS = 12.0
"""One 80-frame window at the default steps, GPU compute, batch 1 (ms)."""
RENDER_MS_PER_FRAME = 2.0
"""Warp + decode per frame, GPU compute, graphed, at the best batch (ms)."""
AVATAR_LOAD_MS = 10.0
"""Loading a cached image avatar onto the GPU (ms)."""
GLASS_P99_MS = {"faithful": {"rtmp": 600.0, "webrtc": 560.0}, "low": {"rtmp": 400.0, "webrtc": 350.0}}
"""Glass-to-glass p99 on loopback per latency mode and path: a marker pushed -> the frame that speaks it, decoded
(ms)."""
FIRST_PUSH_MS = {"low": 400.0}
"""The first push into an idle session -> its first speech frame decoded, where a target is set (ms)."""
SOAK_DRIFT_MS = 40.0
"""bench.soak: every steady stream's drift at the end, of its pictures against its timeline and of its audio against its
video, each from its first window (ms)."""
SOAK_MEMORY_GROWTH = 0.05
"""bench.soak: each process's resident (and GPU) memory growth from the end of the warm-up to the end (a share)."""
