"""The WebRTC preview seen from outside: a real headless Chromium on the preview page, or a Python aiortc viewer.

Both connect the way a user's browser does (WHEP: POST an SDP offer to /whep/0) and note, on this
process's monotonic clock, when each marker burst arrives in the received audio and when the
video frames arrive. Chromium: an AudioWorklet finds the bursts in the audio the page plays
and maps them to the moment they leave the audio output (``AudioContext.getOutputTimestamp``);
``requestVideoFrameCallback`` records every frame shown; getStats gives the jitter buffers.
The aiortc viewer is the second-best measure where no browser can run (the lent GPU): it
decodes with PyAV like the RTMP reader, so its pictures can be matched to the RTMP stream's by
their luma hash, which identifies the very frame that speaks a marker; it is not a browser
(no jitter-buffer playout, no A/V sync).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import numpy as np

from engine.timebase import FPS
from harness.markers import LOUD_FRACTION, QUIET, THRESHOLD, Onset, OnsetDetector
from harness.rtmp_read import ArrivalLog, luma_hash

CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--disable-extensions",
    "--autoplay-policy=no-user-gesture-required",
    "--allow-loopback-in-peer-connection",  # gather 127.0.0.1 candidates
    "--disable-features=WebRtcHideLocalIpsWithMdns",  # raw addresses instead of .local names
]
FRAME_TICKS = 90_000 // FPS
"""RTP video clock ticks per frame (aiortc hands out frames with pts in 1/90000 s from the first one received)."""
OPUS_RATE = 48_000


def chromium_path() -> str | None:
    """Debian's chromium, when installed."""
    found = shutil.which("chromium") or "/usr/bin/chromium"
    return found if Path(found).exists() else None


@dataclass
class ViewerLog:
    """What a viewer saw: marker onsets with their arrival, video frame arrivals, and its own figures."""

    name: str
    onsets: list[tuple[Onset, float]] = field(default_factory=list)
    frames: list[tuple[int, float, str]] = field(default_factory=list)
    """aiortc: (RTP frame number from the first frame received, arrival, luma hash)."""
    shown: list[float] = field(default_factory=list)
    """Chromium: when each frame was shown (requestVideoFrameCallback's expectedDisplayTime)."""
    stats: dict = field(default_factory=dict)
    first_frame_at: float | None = None

    def frame_offset(self, rtmp_luma: dict[str, list[int]]) -> int | None:
        """RTMP frame number minus this viewer's frame number, from the pictures whose hash occurs once in the RTMP
        stream."""
        votes = Counter(
            rtmp_luma[luma][0] - number for number, _, luma in self.frames if len(rtmp_luma.get(luma, ())) == 1
        )
        return votes.most_common(1)[0][0] if votes else None


async def _offer(http: aiohttp.ClientSession, url: str, sdp: str) -> str:
    """The SDP answer to a WHEP offer to ``url``."""
    async with http.post(url, data=sdp, headers={"Content-Type": "application/sdp"}) as response:
        if response.status != 201:
            raise RuntimeError(f"{url} answered {response.status}: {await response.text()}")
        return await response.text()


class AiortcViewer:
    """A Python WebRTC viewer of a session (not a browser; ``whep``: its WHEP URL, default session 0's at
    ``base_url``): decodes video and audio with PyAV through aiortc."""

    def __init__(self, base_url: str, whep: str | None = None, token: str | None = None) -> None:
        self.base_url = base_url
        self.whep = whep or f"{base_url}/whep/0"
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.log = ViewerLog("aiortc")
        self._pc = None
        self._tasks: list[asyncio.Task] = []

    async def start(self) -> None:
        from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription

        from streaming.sinks.webrtc import restrict_ice_to_loopback

        restrict_ice_to_loopback()
        self._pc = pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        pc.addTransceiver("video", direction="recvonly")
        pc.addTransceiver("audio", direction="recvonly")

        @pc.on("track")
        def on_track(track) -> None:
            consume = self._video if track.kind == "video" else self._audio
            self._tasks.append(asyncio.ensure_future(consume(track)))

        await pc.setLocalDescription(await pc.createOffer())
        async with aiohttp.ClientSession(headers=self._headers) as http:
            answer = await _offer(http, self.whep, pc.localDescription.sdp)
        await pc.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))

    async def onsets_seen(self) -> int:
        """Marker bursts found so far."""
        return len(self.log.onsets)

    async def _video(self, track) -> None:
        from aiortc.mediastreams import MediaStreamError

        try:
            while True:
                frame = await track.recv()
                now = time.monotonic()
                self.log.frames.append((round(frame.pts / FRAME_TICKS), now, luma_hash(frame)))
                if self.log.first_frame_at is None:
                    self.log.first_frame_at = now
        except MediaStreamError:
            return

    async def _audio(self, track) -> None:
        from aiortc.mediastreams import MediaStreamError

        detector, arrivals = OnsetDetector(OPUS_RATE), ArrivalLog()
        try:
            while True:
                frame = await track.recv()
                now = time.monotonic()
                samples = frame.to_ndarray().reshape(-1)[:: len(frame.layout.channels)].astype(np.float32) / 32768
                start = float(frame.pts) / frame.sample_rate
                arrivals.add(start, now)
                for onset in detector.feed(samples, start):
                    self.log.onsets.append((onset, arrivals.arrival(onset.time) or now))
        except MediaStreamError:
            return

    async def stop(self) -> ViewerLog:
        if self._pc is not None:
            await self._pc.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        return self.log


# Injected into the preview page once it plays: bursts found by an AudioWorklet in the received audio,
# frames seen by requestVideoFrameCallback, all on the page's performance clock.
PAGE_PROBE = """
async ([threshold, quiet, loudFraction]) => {
  const pc = window.preview.pc;
  const receiver = pc.getReceivers().find((r) => r.track && r.track.kind === 'audio');
  const glass = {onsets: [], shown: [], error: null};
  window.glass = glass;
  const worklet = `
    class Marker extends AudioWorkletProcessor {
      constructor() { super(); this.start = null; this.lastLoud = -1e12; this.loud = 0; }
      process(inputs) {
        const ch = inputs[0] && inputs[0][0];
        if (!ch) return true;
        const quiet = ${quiet} * sampleRate;
        for (let i = 0; i < ch.length; i++) {
          if (Math.abs(ch[i]) > ${threshold}) {
            const f = currentFrame + i;
            if (f - this.lastLoud >= quiet) {
              if (this.start !== null) this.port.postMessage({start: this.start, loud: this.loud});
              this.start = f;
              this.loud = 0;
            }
            this.lastLoud = f;
            this.loud += 1;
          }
        }
        if (this.start !== null && currentFrame + ch.length - this.lastLoud >= quiet) {
          this.port.postMessage({start: this.start, loud: this.loud});
          this.start = null;
        }
        return true;
      }
    }
    registerProcessor('marker', Marker);`;
  const context = new AudioContext();
  await context.audioWorklet.addModule(URL.createObjectURL(new Blob([worklet], {type: 'application/javascript'})));
  const node = new AudioWorkletNode(context, 'marker');
  node.port.onmessage = (event) => {
    const stamp = context.getOutputTimestamp();
    const rate = context.sampleRate;
    const heard = stamp.performanceTime > 0
      ? stamp.performanceTime + (event.data.start / rate - stamp.contextTime) * 1000 : performance.now();
    glass.onsets.push({start: event.data.start / rate, seconds: event.data.loud / rate / loudFraction, heard});
  };
  context.createMediaStreamSource(new MediaStream([receiver.track])).connect(node);
  node.connect(context.destination);
  await context.resume();
  const video = document.getElementById('video');
  const shown = (now, meta) => { glass.shown.push(meta.expectedDisplayTime); video.requestVideoFrameCallback(shown); };
  video.requestVideoFrameCallback(shown);
  return context.state;
}
"""

PAGE_STATS = """
async () => {
  const out = {};
  (await window.preview.pc.getStats()).forEach((s) => {
    if (s.type === 'inbound-rtp') out[s.kind] = {
      jitterBufferDelay: s.jitterBufferDelay, jitterBufferEmittedCount: s.jitterBufferEmittedCount,
      framesDecoded: s.framesDecoded, framesDropped: s.framesDropped, totalDecodeTime: s.totalDecodeTime,
      totalProcessingDelay: s.totalProcessingDelay, totalSamplesReceived: s.totalSamplesReceived,
      concealedSamples: s.concealedSamples, frameWidth: s.frameWidth, frameHeight: s.frameHeight,
    };
  });
  return out;
}
"""


class ChromiumViewer:
    """Headless Chromium (Debian's, through Playwright) on the preview page of session 0."""

    def __init__(self, base_url: str, home: Path, executable: str) -> None:
        self.base_url, self.home, self.executable = base_url, home, executable
        self.log = ViewerLog("chromium")
        self._playwright = self._browser = self._page = None
        self._tmp: str | None = None
        self._offset = 0.0

    async def start(self, timeout: float) -> None:
        """Open the page, wait until it shows video and plays audio, probe it, and calibrate its clock against ours."""
        from playwright.async_api import async_playwright

        self.home.mkdir(parents=True, exist_ok=True)
        self._tmp = tempfile.mkdtemp(prefix="chr-")  # short: Chromium's socket paths must fit in 108 bytes
        env = {
            **os.environ,
            "HOME": str(self.home),
            "TMPDIR": self._tmp,
            "XDG_CONFIG_HOME": str(self.home / ".config"),
            "XDG_CACHE_HOME": str(self.home / ".cache"),
        }
        self._playwright = await async_playwright().start()
        self._browser = await self._playwright.chromium.launch(
            executable_path=self.executable,
            headless=True,
            args=CHROMIUM_FLAGS,
            env=env,
            ignore_default_args=["--mute-audio"],
        )
        self._page = await self._browser.new_page()
        await self._page.goto(f"{self.base_url}/?session=0")
        deadline = time.monotonic() + timeout
        while True:
            stats = await self._page.evaluate("preview.stats()")
            if stats["framesDecoded"] > 0 and stats["audioPackets"] > 0:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"the preview page showed no video and audio within {timeout:.0f} s: {stats}")
            await asyncio.sleep(0.1)
        self.log.first_frame_at = time.monotonic()
        self.log.stats["audio_context"] = await self._page.evaluate(PAGE_PROBE, [THRESHOLD, QUIET, LOUD_FRACTION])
        self._offset = await self._calibrate()

    async def _calibrate(self, rounds: int = 20) -> float:
        """Our monotonic seconds minus the page's performance.now() seconds, from the quickest round trip."""
        best = (float("inf"), 0.0)
        for _ in range(rounds):
            before = time.monotonic()
            page_ms = await self._page.evaluate("performance.now()")
            after = time.monotonic()
            best = min(best, (after - before, (before + after) / 2 - page_ms / 1000))
        self.log.stats["clock_round_trip_ms"] = round(best[0] * 1000, 2)
        return best[1]

    async def onsets_seen(self) -> int:
        """Marker bursts the page has played so far."""
        return await self._page.evaluate("window.glass ? window.glass.onsets.length : 0")

    async def stop(self) -> ViewerLog:
        """Collect the onsets, frames and getStats, then close the browser."""
        try:
            if self._page is not None:
                probe = await self._page.evaluate("window.glass || null")
                if probe is not None:
                    self.log.onsets = [
                        (Onset(o["start"], o["seconds"]), o["heard"] / 1000 + self._offset) for o in probe["onsets"]
                    ]
                    self.log.shown = [t / 1000 + self._offset for t in probe["shown"] if t]
                self.log.stats["inbound"] = json.loads(json.dumps(await self._page.evaluate(PAGE_STATS)))
        finally:
            if self._browser is not None:
                await self._browser.close()
            if self._playwright is not None:
                await self._playwright.stop()
            if self._tmp is not None:
                shutil.rmtree(self._tmp, ignore_errors=True)
        return self.log
