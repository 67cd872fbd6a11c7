"""A remote pipecat bot as its own process, for the tests: ``python -m tests.integrations.remote_bot URL TOKEN``.

It runs ``DittoVideoService(url=...)`` in a pipeline, speaks a second of TTS, then prints one JSON line (the session's
id, whether torch or the engine's runtime were imported) and runs on until it is killed.
"""

from __future__ import annotations

import asyncio
import json
import sys

import numpy as np
from pipecat.frames.frames import TTSAudioRawFrame, TTSStartedFrame, TTSStoppedFrame
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.runner import PipelineRunner
from pipecat.pipeline.task import PipelineParams, PipelineTask

from integrations.pipecat_video import DittoVideoService

RATE = 16_000


async def run(url: str, token: str) -> None:
    video = DittoVideoService(url=url, avatar="anchor", token=token)
    task = PipelineTask(Pipeline([video]), params=PipelineParams())
    runner = asyncio.ensure_future(PipelineRunner(handle_sigint=False).run(task))
    pcm = np.full(RATE, 4000, np.int16).tobytes()
    await task.queue_frames([TTSStartedFrame(), TTSAudioRawFrame(pcm, RATE, 1), TTSStoppedFrame()])
    while video.stats.segments_stopped == 0 or video.backend.session_id is None:
        await asyncio.sleep(0.05)
    report = {
        "session": video.backend.session_id,
        "torch": "torch" in sys.modules,
        "engine_runtime": "engine.runtime" in sys.modules,
    }
    print(json.dumps(report), flush=True)
    await runner


if __name__ == "__main__":
    asyncio.run(run(sys.argv[1], sys.argv[2]))
