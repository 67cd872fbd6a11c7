"""The agent's side of LiveKit's avatar protocol in the integration tests: the real ``QueueAudioOutput`` recording
each playback notification the avatar sends it."""

from __future__ import annotations

from livekit.agents.voice.avatar import QueueAudioOutput

TTS_RATE = 24_000


class AgentAudio(QueueAudioOutput):
    """The agent's audio output (the real ``QueueAudioOutput``), recording each notification; with
    ``wait_playback_start`` it asks for ``lk.playback_started`` as an agent of a remote avatar does."""

    def __init__(self, wait_playback_start: bool = False) -> None:
        super().__init__(sample_rate=TTS_RATE, wait_playback_start=wait_playback_start)
        self.events: list[tuple[str, float, bool]] = []

    def notify_playback_started(self) -> None:
        self.events.append(("started", 0.0, False))
        super().notify_playback_started()

    def notify_playback_finished(self, playback_position: float, interrupted: bool) -> None:
        self.events.append(("finished", playback_position, interrupted))
        super().notify_playback_finished(playback_position, interrupted)

    def finished(self) -> list[tuple[str, float, bool]]:
        return [e for e in self.events if e[0] == "finished"]
