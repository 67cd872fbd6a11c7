"""Push a WAV file into a live session of ``python -m apps.serve`` over its push WebSocket, as a TTS engine would.

    python examples/push_wav.py speech.wav "ws://127.0.0.1:8080/push?session=ID"

The URL is the ``urls.push`` of the session ``POST /sessions`` answered. The file must be 16-bit PCM (any rate,
mono or stereo). The audio goes in 100 ms messages as fast as the service takes it (it slows a client that runs
more than 5 s ahead); then ``end`` asks the service to speak what is left and end the session's stream. The
protocol: docs/push.md.
"""

import asyncio
import sys
import wave

import aiohttp


async def push(path: str, url: str) -> None:
    with wave.open(path, "rb") as wav:
        if wav.getsampwidth() != 2:
            raise SystemExit(f"{path}: 16-bit PCM only (this file has {8 * wav.getsampwidth()}-bit samples)")
        rate, channels, pcm = wav.getframerate(), wav.getnchannels(), wav.readframes(wav.getnframes())
    async with aiohttp.ClientSession() as http, http.ws_connect(url) as ws:
        await ws.send_json({"type": "format", "sample_rate": rate, "channels": channels, "encoding": "s16le"})
        print(await ws.receive_json())  # {"type": "ready", ...}
        step = rate // 10 * 2 * channels  # 100 ms of 16-bit frames per message
        for start in range(0, len(pcm), step):
            await ws.send_bytes(pcm[start : start + step])
        await ws.send_json({"type": "end"})  # speak what is left, then end the stream
        print(await ws.receive_json())  # {"type": "ended"}


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    asyncio.run(push(sys.argv[1], sys.argv[2]))
