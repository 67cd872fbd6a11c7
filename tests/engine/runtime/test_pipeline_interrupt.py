"""An interrupt on the loop's side: the frames not taken are dropped, and the picture blends from the last frame shown.

Driven like tests/engine/runtime/test_pipeline_controls.py: one session's pipeline ticked by hand with the real LMDM and
stitching network on random weights; nothing is rendered.
"""

from __future__ import annotations

import pytest
import torch

from engine.engine import Engine
from engine.runtime.avatars import LoadedAvatar
from engine.runtime.pipeline import BLEND_FRAMES
from tests.engine.runtime.test_pipeline_controls import Loop

pytestmark = pytest.mark.slow


def test_after_an_interrupt_the_motion_blends_from_the_last_frame_shown_not_the_last_one_made(
    engine: Engine, avatar: LoadedAvatar
) -> None:
    loop = Loop(engine, avatar)
    loop.push(0.8)
    loop.tick()
    shown = [loop.session.next_frame(timeout=0) for _ in range(3)]
    assert [f.index for f in shown] == [0, 1, 2] and loop.session.frames_queued > 0, "frames made but not shown wait"
    made_last = loop.stitched[-1][0]

    loop.session.interrupt()
    loop.push(0.8, seed=1)
    loop.tick(stitch=False)
    unblended = loop.pipeline.backlog.clone()
    assert unblended.shape[0] > BLEND_FRAMES, "the new speech's frames are final"
    motion, _, _ = loop.pipeline.pose(unblended.shape[0])

    weight = (torch.arange(1, BLEND_FRAMES + 1, dtype=motion.dtype) / (BLEND_FRAMES + 1))[:, None]
    expected = shown[-1].motion * (1 - weight) + unblended[:BLEND_FRAMES] * weight
    torch.testing.assert_close(motion[:BLEND_FRAMES], expected, rtol=0, atol=1e-6)
    assert torch.equal(motion[BLEND_FRAMES:], unblended[BLEND_FRAMES:]), "after the blend, the stream's own motion"
    assert not torch.allclose(shown[-1].motion, made_last), "the last frame shown is not the last one made"

    loop.pipeline.deliver(motion, torch.zeros(motion.shape[0], 2, 2, 3, dtype=torch.uint8), None)
    after = loop.session.take_ready()
    assert after[0].index == shown[-1].index + 1, "numbered on from the last frame shown: the untaken ones are gone"
    assert torch.equal(after[0].motion, motion[0])
