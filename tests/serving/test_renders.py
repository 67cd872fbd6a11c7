"""Render jobs on the live service: a clip in, an MP4 out of the operator's folder, as the processes run it.

The core runs the synthetic runtime (its render jobs make frames at ten times real time), so what is under test is the
job's way through the service: the upload's checks, the queue, the ring's backpressure into one file, progress,
cancel, and the file's frames and length against the audio's.
"""

from __future__ import annotations

import asyncio
import io
import math
import sys
import wave
from pathlib import Path

import aiohttp
import av
import numpy as np
import pytest

from serving.api import SessionError
from serving.renders import RenderLimits, Renders, RenderSpec
from tests.serving.test_service import running

pytestmark = pytest.mark.slow
RUNTIME = "tests.streaming.synthetic_runtime:build"


def serving(limits: RenderLimits):
    """The synthetic service with one output worker, taking render jobs within ``limits``."""
    return running(workers=1, renders=limits)


def wav_bytes(seconds: float, rate: int = 24_000) -> bytes:
    """A 220 Hz tone as a WAV file's bytes."""
    t = np.arange(int(seconds * rate)) / rate
    samples = (0.5 * np.sin(2 * np.pi * 220 * t) * 32767).astype(np.int16)
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(samples.tobytes())
    return out.getvalue()


async def finished(http: aiohttp.ClientSession, url: str, seconds: float = 30.0) -> dict:
    for _ in range(int(seconds / 0.1)):
        job = await (await http.get(url)).json()
        if job["state"] in ("done", "failed", "cancelled"):
            return job
        await asyncio.sleep(0.1)
    raise AssertionError(f"the job did not finish in {seconds} s: {job}")


def test_a_clip_renders_to_an_mp4_of_exactly_its_length_with_progress_then_its_file_is_deleted(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serving(RenderLimits(tmp_path / "renders")) as (_, http, base):
            seconds = 3.3
            answer = await http.post(
                f"{base}/renders?avatar=anna&seed=3", data=wav_bytes(seconds), headers={"Content-Type": "audio/wav"}
            )
            assert answer.status == 202, await answer.text()
            job = await answer.json()
            assert job["state"] in ("queued", "running") and job["frames_total"] == math.ceil(seconds * 25)
            done = await (await http.get(f"{job['urls']['self']}?wait=25")).json()
            assert done["state"] == "done", f"a GET with wait answers once the job ends: {done}"
            assert done["frames_done"] == done["frames_total"] == 83
            for wait in ("-1", "31", "soon"):
                refused = await http.get(f"{job['urls']['self']}?wait={wait}")
                assert refused.status == 400 and "wait must be seconds" in (await refused.json())["error"]
            kinds = [e["type"] for e in done["events"]]
            assert kinds[:2] == ["queued", "started"] and kinds[-1] == "done" and "progress" in kinds

            video = await http.get(job["urls"]["video"])
            assert video.status == 200 and video.content_type == "video/mp4"
            data = await video.read()
            with av.open(io.BytesIO(data)) as container:
                frames = sum(1 for _ in container.decode(video=0))
                v, a = container.streams.video[0], container.streams.audio[0]
                assert (v.codec_context.name, a.codec_context.name) == ("h264", "aac")
                assert (v.width, v.height) == (64, 64)
                video_seconds = float(v.duration * v.time_base)
                audio_seconds = float(a.duration * a.time_base)
            assert frames == 83, "every frame of the clip, none repeated or dropped"
            assert video_seconds == pytest.approx(83 / 25, abs=0.001)
            assert audio_seconds == pytest.approx(video_seconds, abs=0.03), "the audio ends with the video"

            metrics = await (await http.get(f"{base}/metrics")).text()
            assert 'ditto_render_jobs_ended_total{state="done"} 1.0' in metrics

            files = list((tmp_path / "renders").iterdir())
            assert [f.name for f in files] == [f"render-{job['id']}.mp4"], "named by the service, in its folder"
            assert (await http.delete(job["urls"]["self"])).status == 200
            assert not list((tmp_path / "renders").iterdir()) and (await http.get(job["urls"]["self"])).status == 404

    asyncio.run(scenario())


def test_a_job_cancelled_midway_or_at_once_frees_its_place_for_the_next_and_leaves_no_file(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serving(RenderLimits(tmp_path / "renders", queue=1)) as (service, http, base):
            post = lambda seconds: http.post(f"{base}/renders?avatar=anna", data=wav_bytes(seconds))  # noqa: E731
            long = await (await post(120.0)).json()
            queued = await (await post(1.0)).json()
            full = await post(1.0)
            assert full.status == 503 and "render queue is full" in (await full.json())["error"]
            for _ in range(100):
                job = await (await http.get(long["urls"]["self"])).json()
                if job["frames_done"] >= 25:
                    break
                await asyncio.sleep(0.1)
            assert job["state"] == "running" and 25 <= job["frames_done"] < job["frames_total"]
            assert job["eta_seconds"] is not None and job["frames_per_second"] > 0

            cancelled = await http.delete(long["urls"]["self"])
            assert cancelled.status == 200 and (await cancelled.json())["state"] == "cancelled"
            nxt = await finished(http, queued["urls"]["self"])
            assert nxt["state"] == "done" and nxt["frames_done"] == 25, "the next job ran once the slot was free"
            names = [f.name for f in (tmp_path / "renders").iterdir()]
            assert names == [f"render-{queued['id']}.mp4"], "the cancelled job's file is gone"
            started = asyncio.get_running_loop().time()
            hasty = await (await post(120.0)).json()
            cancelled = await http.delete(hasty["urls"]["self"])
            took = asyncio.get_running_loop().time() - started
            assert cancelled.status == 200 and (await cancelled.json())["state"] == "cancelled"
            assert took < 5, f"a job cancelled while it opens is closed once open, not timed out ({took:.1f} s)"
            await asyncio.sleep(0.5)
            stats = await service.refresh()
            assert stats["sessions"] == 0, "the core holds no session of any of the jobs"

    asyncio.run(scenario())


def test_bad_uploads_are_clear_4xx_and_nothing_is_written(tmp_path: Path) -> None:
    audio = tmp_path / "audio"
    audio.mkdir()
    (audio / "clip.wav").write_bytes(wav_bytes(0.5))
    (tmp_path / "secret.wav").write_bytes(wav_bytes(0.5))
    (audio / "link.wav").symlink_to(tmp_path / "secret.wav")
    limits = RenderLimits(tmp_path / "renders", audio_folder=audio, max_seconds=2.0, max_mb=0.5)

    async def scenario() -> None:
        async with serving(limits) as (_, http, base):

            async def refused(status: int, text: str, **request) -> None:
                answer = await http.post(f"{base}/renders", **request)
                body = await answer.json()
                assert answer.status == status and text in body["error"], (answer.status, body)

            await refused(415, "not audio", params={"avatar": "anna"}, data=b"<html>not audio at all</html>")
            await refused(415, "cannot decode", params={"avatar": "anna"}, data=b"RIFF\0\0\0\0WAVEjunkjunkjunk")
            await refused(413, "longer than this service renders (2 s)", params={"avatar": "anna"}, data=wav_bytes(3))
            await refused(413, "over this service's 0.5 MB", params={"avatar": "anna"}, data=b"\0" * 600_000)
            await refused(404, "no avatar 'nobody'", params={"avatar": "nobody"}, data=wav_bytes(0.5))
            await refused(400, "unknown option", params={"avatar": "anna", "path": "/etc"}, data=wav_bytes(0.5))
            await refused(400, '"overlap" is an integer', params={"avatar": "anna", "overlap": "80"}, data=wav_bytes(1))
            await refused(400, "takes the audio as its body", params={"avatar": "anna"})
            await refused(400, "plain name", json={"avatar": "anna", "audio_file": "../secret.wav"})
            await refused(404, "no audio file 'link.wav'", json={"avatar": "anna", "audio_file": "link.wav"})
            assert not (tmp_path / "renders").exists() or not list((tmp_path / "renders").iterdir())

            answer = await http.post(f"{base}/renders", json={"avatar": "anna", "audio_file": "clip.wav"})
            assert answer.status == 202, await answer.text()
            assert (await finished(http, (await answer.json())["urls"]["self"]))["frames_done"] == 13

    asyncio.run(scenario())


def test_apps_render_with_service_sends_the_job_shows_progress_and_writes_the_mp4(tmp_path: Path) -> None:
    clip = tmp_path / "clip.wav"
    clip.write_bytes(wav_bytes(2.0))
    out = tmp_path / "out" / "clip.mp4"

    async def scenario() -> None:
        async with serving(RenderLimits(tmp_path / "renders")) as (_, _http, base):
            command = [sys.executable, "-m", "apps.render", "--service", base, "--avatar", "anna"]
            process = await asyncio.create_subprocess_exec(
                *command, "--audio", str(clip), "--out", str(out), stderr=asyncio.subprocess.PIPE
            )
            _, stderr = await asyncio.wait_for(process.communicate(), 60)
            text = stderr.decode()
            assert process.returncode == 0, text
            assert "rendering on the service" in text and f"wrote {out}: 50 frames" in text
            assert not list((tmp_path / "renders").iterdir()), "the service keeps no copy once downloaded"

            bad = await asyncio.create_subprocess_exec(
                *command[:-1],
                "nobody",
                "--audio",
                str(clip),
                "--out",
                str(tmp_path / "x.mp4"),
                stderr=asyncio.subprocess.PIPE,
            )
            _, stderr = await asyncio.wait_for(bad.communicate(), 60)
            assert bad.returncode != 0 and "404 no avatar 'nobody'" in stderr.decode()

    asyncio.run(scenario())
    with av.open(str(out)) as container:
        assert sum(1 for _ in container.decode(video=0)) == 50


def test_a_queue_of_zero_runs_one_job_at_a_time_and_refuses_a_second_while_it_runs(tmp_path: Path) -> None:
    async def scenario() -> None:
        opened: list[str] = []

        async def open_job(job) -> None:
            opened.append(job.id)

        async def send_core(message) -> None:
            return None

        renders = Renders(RenderLimits(tmp_path, queue=0), open_job, send_core, lambda job, message: None)
        first = renders.submit(RenderSpec(pcm=np.zeros(16_000, np.float32), avatar="anna"))
        await asyncio.sleep(0)
        assert first.state == "running" and opened == [first.id], "nothing runs: the job starts at once"
        with pytest.raises(SessionError, match="render queue is full"):
            renders.submit(RenderSpec(pcm=np.zeros(16_000, np.float32), avatar="anna"))

    asyncio.run(scenario())
