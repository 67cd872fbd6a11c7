"""A pipecat voice bot whose face is a Ditto avatar of the live service: the bot is a thin client, no GPU in it.

    python -m apps.avatars register portrait.png --name anchor   # once, in the environment with the face extra
    python -m apps.serve                                         # the service, on the GPU host (--device cpu without)
    python examples/pipecat_bot.py --service http://127.0.0.1:8080
    # the bot (pipecat extra): then open http://127.0.0.1:7860/ and press Connect

Without official checkpoints the service runs random weights: the avatar's pictures move but are not a face (and on a
CPU the service makes a frame every few seconds; the bot shows each until the next). The page sends the microphone
to the bot over SmallWebRTC and plays what the bot sends back. A stand-in for STT, LLM and TTS (no API key needed)
answers every time you stop speaking with the bundled espeak-ng sentence, and stops when you speak over it (Silero
VAD, shipped with pipecat). Replace ``ClipSpeaker`` with your STT, LLM and TTS services for a real agent.
"""

from __future__ import annotations

import argparse
import asyncio
import wave
from pathlib import Path

from aiohttp import web
from pipecat.audio.vad.silero import SileroVADAnalyzer
from pipecat.frames.frames import (
    Frame,
    StartFrame,
    TTSAudioRawFrame,
    TTSStartedFrame,
    TTSStoppedFrame,
    VADUserStartedSpeakingFrame,
    VADUserStoppedSpeakingFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.runner import PipelineRunner
from pipecat.pipeline.task import PipelineParams, PipelineTask
from pipecat.processors.audio.vad_processor import VADProcessor
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.transports.base_transport import TransportParams
from pipecat.transports.smallwebrtc.connection import SmallWebRTCConnection
from pipecat.transports.smallwebrtc.transport import SmallWebRTCTransport

from integrations.pipecat_video import DittoVideoService
from integrations.whep_receiver import gather_on_loopback_too

REPO = Path(__file__).resolve().parents[1]
CLIP = REPO / "engine" / "assets" / "demo_speech.wav"
PAGE = Path(__file__).resolve().parent / "web" / "pipecat_bot.html"
CHUNK_S = 0.02


class ClipSpeaker(FrameProcessor):
    """A stand-in TTS: says one recorded sentence at the start and after each user turn; the user's voice cuts it."""

    def __init__(self, clip: Path) -> None:
        super().__init__()
        with wave.open(str(clip), "rb") as wav:
            self.rate, self.channels = wav.getframerate(), wav.getnchannels()
            self.pcm = wav.readframes(wav.getnframes())

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        await self.push_frame(frame, direction)
        if isinstance(frame, StartFrame):
            await self.say()
        elif isinstance(frame, VADUserStartedSpeakingFrame):
            await self.broadcast_interruption()
        elif isinstance(frame, VADUserStoppedSpeakingFrame):
            await self.say()

    async def say(self) -> None:
        """The sentence as a TTS service sends it: TTSStarted, 20 ms audio chunks, TTSStopped."""
        step = int(self.rate * CHUNK_S) * 2 * self.channels
        await self.push_frame(TTSStartedFrame())
        for start in range(0, len(self.pcm), step):
            await self.push_frame(TTSAudioRawFrame(self.pcm[start : start + step], self.rate, self.channels))
        await self.push_frame(TTSStoppedFrame())


def bot_app(service: str, avatar: str, token: str | None, size: tuple[int, int]) -> web.Application:
    """The page and its offer endpoint: one pipeline (and one session on the service) per browser connection; the
    sessions end when their browser leaves or the bot stops."""
    runs: dict[asyncio.Task, PipelineTask] = {}
    gather_on_loopback_too()  # the page is served on 127.0.0.1: its browser reaches the bot there

    async def offer(request: web.Request) -> web.Response:
        body = await request.json()
        connection = SmallWebRTCConnection()
        await connection.initialize(sdp=body["sdp"], type=body["type"])
        transport = SmallWebRTCTransport(
            webrtc_connection=connection,
            params=TransportParams(
                audio_in_enabled=True,
                audio_out_enabled=True,
                video_out_enabled=True,
                video_out_is_live=True,
                video_out_width=size[0],
                video_out_height=size[1],
                video_out_framerate=25,
            ),
        )
        video = DittoVideoService(url=service, avatar=avatar, token=token)
        vad = VADProcessor(vad_analyzer=SileroVADAnalyzer())
        pipeline = Pipeline([transport.input(), vad, ClipSpeaker(CLIP), video, transport.output()])
        task = PipelineTask(pipeline, params=PipelineParams())

        @transport.event_handler("on_client_disconnected")
        async def gone(_transport, _client) -> None:
            await task.cancel()

        run = asyncio.ensure_future(PipelineRunner(handle_sigint=False).run(task))
        runs[run] = task
        run.add_done_callback(lambda done: runs.pop(done, None))
        return web.json_response(connection.get_answer())

    async def stop_bots(_app: web.Application) -> None:
        for run, task in list(runs.items()):
            await task.cancel()  # CancelFrame: the service's session is deleted at once
            await asyncio.wait([run], timeout=10)

    app = web.Application()
    app.on_shutdown.append(stop_bots)
    app.router.add_get("/", lambda _: web.FileResponse(PAGE))
    app.router.add_post("/offer", offer)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--service", default="http://127.0.0.1:8080", help="the live service's URL (apps.serve)")
    parser.add_argument("--avatar", default="anchor", help="a registered avatar of the service")
    parser.add_argument("--token", help="the service's token, if it has one")
    parser.add_argument("--size", default="512x512", help="the transport's video size, WxH (the avatar's frame size)")
    parser.add_argument("--port", type=int, default=7860, help="the page's port on 127.0.0.1")
    args = parser.parse_args()
    width, height = (int(n) for n in args.size.split("x"))
    web.run_app(bot_app(args.service, args.avatar, args.token, (width, height)), host="127.0.0.1", port=args.port)


if __name__ == "__main__":
    main()
