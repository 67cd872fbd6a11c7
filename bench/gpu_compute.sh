#!/usr/bin/env bash
# One call on the lent GPU: carried wheels, GPU-only tests, the parts' GPU compute (bench.compute), the demo.
# Usage there: bash bench/gpu_compute.sh AVATAR_DIR   (results and logs under $OUT)
set -uo pipefail
avatar=${1:?cached avatar folder}
source bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/gpu.txt"
python3 -m pytest -q -p no:cacheprovider tests/engine/networks -k "fp16 or cuda" 2>&1 | tail -15 | tee "$out/gpu_tests.log"
python3 -m bench.compute --avatar "$avatar" --out "$out/compute.json" "${@:2}" 2>&1 | tee "$out/compute.log" | tail -40
python3 -m apps.render --avatar "$avatar" --audio engine/assets/demo_speech.wav --out "$out/demo.mp4" 2>&1 | tail -4
