#!/usr/bin/env bash
# One call on the lent GPU for the audio encoder and the side-by-side numbers: HuBERT per hop (1 and 16 sessions),
# the reference's own modules beside ours, 25 against 50 DDIM steps.
# Usage there: bash bench/gpu_side_by_side.sh AVATAR_DIR REFERENCE_DIR [hubert]   (results and logs under $OUT)
set -uo pipefail
avatar=${1:?cached avatar folder}
reference=${2:?reference checkout}
source bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/gpu.txt"
python3 -m pytest -q -p no:cacheprovider tests/engine/audio 2>&1 | tail -3 | tee "$out/gpu_tests.log"
if [[ ${3:-} == hubert ]]; then
    timeout 150 python3 -m bench.hubert --device cuda --batches 1 16 --onnxruntime --out "$out/hubert.json" > "$out/hubert.log" 2>&1
    tail -15 "$out/hubert.log"
fi
DITTO_REFERENCE_DIR=$reference timeout 260 python3 -m bench.reference --device cuda --out "$out/reference.json" > "$out/reference.log" 2>&1
tail -9 "$out/reference.log"
timeout 200 python3 -m bench.steps --avatar "$avatar" --device cuda --out "$out/steps.json" > "$out/steps.log" 2>&1
tail -6 "$out/steps.log"
