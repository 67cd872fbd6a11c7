"""A LiveKit voice agent whose face is a Ditto avatar of the live service: the service joins the agent's room as the
avatar and speaks the agent's audio there; the agent holds no GPU and no model.

    LIVEKIT_URL=ws://127.0.0.1:7880 LIVEKIT_API_KEY=devkey LIVEKIT_API_SECRET=secret \\
        DITTO_URL=http://127.0.0.1:8080 python examples/livekit_agent.py dev

It needs two things running: a LiveKit server (LiveKit Cloud, or ``livekit-server --dev`` on your machine, whose URL
and keys are the ones above) and the service on the GPU host (``python -m apps.serve --avatar portrait.png``;
``DITTO_TOKEN`` is its ``--token`` when it serves beyond 127.0.0.1). CI has no LiveKit server, so this example does not
run there: the service's room output is tested against LiveKit's own agent classes without a server, and
``tests/integrations/test_livekit_room.py`` runs the whole path when ``LIVEKIT_URL`` is set. Then open a room with the
agent in it, for example from the LiveKit Agents Playground (https://agents-playground.livekit.io) connected to the
same server: the avatar joins, and the agent says the bundled sentence when you join and every few seconds after (a
stand-in for STT, LLM and TTS: no API key needed). Replace ``say_the_clip`` with your STT, LLM and TTS for a real agent:
``LiveSession(stt=..., llm=..., tts=...)``. Without official checkpoints the service runs random weights: the avatar
moves but is not a face.
"""

from __future__ import annotations

import asyncio
import os
import wave
from collections.abc import AsyncIterator
from pathlib import Path

from livekit import rtc
from livekit.agents import Agent, AgentServer, JobContext, cli

from integrations.livekit_avatar import DittoAvatarSession
from integrations.livekit_compat import LiveSession  # livekit-agents' AgentSession (1.8), LiveSession (2.0)

CLIP = Path(__file__).resolve().parents[1] / "engine" / "assets" / "demo_speech.wav"
CHUNK_S = 0.02
PAUSE_S = 4.0

server = AgentServer()


async def clip_frames(clip: Path = CLIP) -> AsyncIterator[rtc.AudioFrame]:
    """The recorded sentence as a TTS streams it: 20 ms frames of 16-bit PCM."""
    with wave.open(str(clip), "rb") as wav:
        rate, channels, pcm = wav.getframerate(), wav.getnchannels(), wav.readframes(wav.getnframes())
    step = round(rate * CHUNK_S) * 2 * channels
    for start in range(0, len(pcm) - step + 1, step):
        yield rtc.AudioFrame(pcm[start : start + step], rate, channels, step // (2 * channels))


async def say_the_clip(session: LiveSession) -> None:
    """The stand-in for a conversation: the sentence, a pause, again, until the job ends."""
    while True:
        await session.say("(the bundled sentence)", audio=clip_frames())
        await asyncio.sleep(PAUSE_S)


@server.rtc_session()
async def entrypoint(ctx: JobContext) -> None:
    """One job per room: connect, put the avatar in (the service answers once it is there), start talking."""
    await ctx.connect()
    session = LiveSession()
    avatar = DittoAvatarSession(
        os.environ.get("DITTO_URL", "http://127.0.0.1:8080"),
        token=os.environ.get("DITTO_TOKEN"),
        avatar=os.environ.get("DITTO_AVATAR", "anchor"),
        livekit_url=os.environ["LIVEKIT_URL"],
        api_key=os.environ["LIVEKIT_API_KEY"],
        api_secret=os.environ["LIVEKIT_API_SECRET"],
    )
    await avatar.start(session, room=ctx.room)  # routes the agent's audio to the avatar; aclose() at the job's end
    await session.start(agent=Agent(instructions="A stand-in agent that says one recorded sentence."), room=ctx.room)
    await say_the_clip(session)


if __name__ == "__main__":
    cli.run_app(server)
