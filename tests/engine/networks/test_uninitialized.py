"""Networks are built without random initial weights, and lose nothing by it: a loaded network holds its checkpoint's
tensors exactly, and what a module computes for itself at construction is as a plain build computes it."""

from __future__ import annotations

import torch
from torch.nn import init

from engine.networks import OFFICIAL_FILENAMES, load_network, network_module
from engine.networks.checkpoints import read_checkpoint
from engine.networks.uninitialized import RANDOM_FILLS, without_random_init


def test_a_loaded_network_holds_its_checkpoints_tensors_and_its_own_schedule_as_a_plain_build_has_it(
    checkpoint_dir,
) -> None:
    path = checkpoint_dir("lmdm") / OFFICIAL_FILENAMES["lmdm"]
    loaded = load_network("lmdm", path)
    stored = read_checkpoint("lmdm", path)
    assert set(loaded.state_dict()) == set(stored)
    assert all(torch.equal(tensor, stored[key]) for key, tensor in loaded.state_dict().items())
    plain = dict(network_module("lmdm").build(stored).named_buffers())
    computed = {key: buffer for key, buffer in loaded.named_buffers() if key not in stored}
    assert computed, "the LMDM computes its diffusion schedule at construction"
    assert all(torch.equal(buffer, plain[key]) for key, buffer in computed.items())


def test_the_random_fills_are_switched_off_only_while_building() -> None:
    before = {name: getattr(init, name) for name in RANDOM_FILLS}
    with without_random_init():
        assert all(getattr(init, name) is not before[name] for name in RANDOM_FILLS)
        weight = torch.zeros(4, 4)
        init.kaiming_uniform_(weight)
        assert torch.count_nonzero(weight) == 0, "left as allocated"
    assert all(getattr(init, name) is before[name] for name in RANDOM_FILLS)
    init.kaiming_uniform_(weight)
    assert torch.count_nonzero(weight) > 0
