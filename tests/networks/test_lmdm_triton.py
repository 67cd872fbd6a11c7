"""The LMDM decoder layer's Triton kernels against ``FusedLayer``'s PyTorch arithmetic (fp16 products).

The kernels run on the CPU in Triton's interpreter (``TRITON_INTERPRET=1``, set in a child
process so that no other test sees it); on a GPU they run for real in ``test_lmdm_fused``'s CUDA
window test. Deterministic random weights in the official layout: arithmetic, not motion quality.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

CHECK = """
import json, torch
from engine.engine import random_checkpoints
from engine.networks import OFFICIAL_FILENAMES, load_network
from engine.networks.lmdm_fused import FusedLMDMStep
from engine.networks.lmdm_triton import decoder_layer

net = load_network("lmdm", random_checkpoints() / OFFICIAL_FILENAMES["lmdm"]).requires_grad_(False)
layer = FusedLMDMStep(net, torch.float16).layers[3]
g = torch.Generator().manual_seed(0)
sequences, frames = 3, 80  # 240 rows: a partial 32-row block; three sequences with their own FiLM rows
x = torch.randn(sequences, frames, 512, generator=g) * 2 + 0.5
keys, values = (torch.randn(sequences, 8, frames + 2, 64, generator=g).half() for _ in range(2))
film = torch.cat([torch.ones(512), torch.zeros(512)])
modulation = torch.randn(sequences, 3, 1024, generator=g) * 0.2 + film
with torch.no_grad():
    expected = layer(x, keys.float(), values.float(), modulation)
    got = decoder_layer(layer, x, keys, values, modulation)
print(json.dumps({"relative": float((got - expected).norm() / expected.norm()), "dtype": str(got.dtype),
                  "shape": list(got.shape), "moved": float((got - x).norm() / x.norm())}))
"""


@pytest.mark.slow
def test_a_decoder_layer_in_triton_kernels_computes_the_fused_layer() -> None:
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(root)}
    done = subprocess.run([sys.executable, "-c", CHECK], env=env, cwd=root, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["shape"] == [3, 80, 512] and result["dtype"] == "torch.float32"
    assert result["moved"] > 0.05, "the layer changed its input"
    assert result["relative"] < 1e-3, f"Triton layer vs FusedLayer: relative difference {result['relative']:.1e}"
