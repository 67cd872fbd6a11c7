"""The messages between the service's processes: each travels as itself, and nothing else is taken for one."""

from __future__ import annotations

import dataclasses

import msgpack
import pytest

from serving import protocol
from serving.protocol import FrameReady, PreviewPacket, Refused, SegmentsClosed, decode, encode

EXAMPLES = [
    FrameReady("s1", index=7, speech=True, anchor=12.5, segment=2),
    SegmentsClosed("s1", closed=((1, False), (2, True))),
    PreviewPacket("s1", 3, 1280, 720, b"\x00\x00\x01", True, ((120, b"opus"),), False, False, 2),
    Refused("no session 's2'", "not_found"),
    protocol.Hello(),
    protocol.SessionOutputs("s1", ("rtmp://h/a/k",), None, True, {"size": "720p", "bitrate_kbps": 3500}),
    protocol.OpenSession("s1", "anchor", None, "faithful", 0, None, "ipc:///tmp/x/w", 1280, 720),
    protocol.CostMeasured(0, 1920, 1080, "veryfast", 20.3),
]


@pytest.mark.parametrize("message", EXAMPLES, ids=lambda m: type(m).__name__)
def test_a_message_comes_back_as_it_was_sent(message: protocol.Message) -> None:
    assert decode(encode(message)) == message


def test_every_message_is_a_frozen_value_with_a_name_of_its_own() -> None:
    kinds = [
        cls
        for group in (protocol.CoreRequest, protocol.CoreReply, protocol.ToWorker, protocol.Event)
        for cls in group.__args__
    ]
    assert len({cls.__name__ for cls in kinds}) == len(set(kinds))
    for cls in kinds:
        assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen and hasattr(cls, "__slots__")


@pytest.mark.parametrize(
    "data", [msgpack.packb({"type": "frame"}), msgpack.packb(["Pickle", {}]), msgpack.packb(["FrameReady", {"id": 1}])]
)
def test_anything_else_is_refused(data: bytes) -> None:
    with pytest.raises(ValueError, match="not a service message"):
        decode(data)


def test_a_process_is_started_with_its_configuration_on_its_command_line() -> None:
    core = protocol.CoreConfig("ipc:///tmp/x/core", "ipc:///tmp/x/events", avatars={"anchor": None}, admission=False)
    worker = protocol.WorkerConfig(2, "ipc:///tmp/x/worker-2", "ipc:///tmp/x/events")
    assert protocol.from_argument(protocol.CoreConfig, protocol.to_argument(core)) == core
    assert protocol.from_argument(protocol.WorkerConfig, protocol.to_argument(worker)) == worker
