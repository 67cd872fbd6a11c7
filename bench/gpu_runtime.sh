#!/usr/bin/env bash
# One call on the lent GPU for the serving runtime: cold and warm starts, the session curve, the newsroom render.
# Usage there: bash bench/gpu_runtime.sh AVATAR_DIR   (results and logs under $OUT)
set -uo pipefail
avatar=${1:?cached avatar folder}
source bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/gpu.txt"
newsroom_clip
for run in cold; do
    start=$EPOCHREALTIME
    python3 -m bench.runtime --avatar "$avatar" --out "$out/start_$run.json" --start-only 2>&1 | grep -v "^warming" | tail -3 | tee -a "$out/starts.log"
    echo "$run start: $(since "$start") s from process start to a warmed-up runtime" | tee -a "$out/starts.log"
done
for run in 1 2; do
    start=$EPOCHREALTIME
    timeout 120 python3 -m apps.render --avatar "$avatar" --audio /tmp/newsroom.wav --out "/tmp/newsroom.mp4" 2>&1 | tail -2 | tee -a "$out/newsroom.log"
    echo "newsroom run $run: $(since "$start") s process start to MP4" | tee -a "$out/newsroom.log"
done
timeout 400 python3 -m bench.runtime --avatar "$avatar" --out "$out/runtime.json" "${@:2}" 2>&1 | grep -v "^warming" | tee "$out/runtime.log" | tail -30
