"""A LiveKit room's encode cost per frame: VP8 of the simulcast layers LiveKit publishes by default, and Opus."""

from __future__ import annotations

from streaming.encoders.room_cost import room_cost_ms, simulcast_layers


def test_a_room_is_encoded_in_the_simulcast_layers_livekit_publishes_by_default() -> None:
    assert simulcast_layers(320, 320) == [(320, 320)], "below 480 pixels on the long side: the full size alone"
    assert simulcast_layers(512, 512) == [(512, 512), (360, 360)], "from 480: and a 360-line layer"
    assert simulcast_layers(1280, 720) == [(1280, 720), (640, 360), (320, 180)], "from 960: and a 180-line one"
    assert simulcast_layers(1080, 1920) == [(1080, 1920), (360, 640), (180, 320)], "a portrait stream alike"
    assert simulcast_layers(640, 360) == [(640, 360), (640, 360)], "never scaled up: the 360 layer is full size"


def test_a_room_s_cost_is_one_thread_s_cpu_time_and_grows_with_its_size() -> None:
    small, large = room_cost_ms(320, 180, frames=6), room_cost_ms(1280, 720, frames=6)
    assert 0 < small < large
