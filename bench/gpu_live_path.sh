#!/usr/bin/env bash
# One call on the lent GPU for the live path: the newsroom render, encode + mux per frame, utterance latency.
# Usage there: bash bench/gpu_live_path.sh AVATAR_DIR   (results and logs under $OUT)
set -uo pipefail
avatar=${1:?cached avatar folder}
source bench/gpu_env.sh
newsroom_clip
for run in 1 2; do
    start=$EPOCHREALTIME
    timeout 120 python3 -m apps.render --avatar "$avatar" --audio /tmp/newsroom.wav --out /tmp/newsroom.mp4 2>&1 | tail -2 | tee -a "$out/newsroom.log"
    echo "newsroom run $run: $(since "$start") s process start to MP4 (7.84 s clip, uncompiled, graphs captured)" | tee -a "$out/newsroom.log"
done
timeout 150 python3 -m bench.encode --device cuda --sessions 1 8 --out "$out/encode.json" 2>&1 | tail -12 | tee "$out/encode.log"
timeout 330 python3 -m bench.runtime --avatar "$avatar" --out "$out/latency.json" --latency-only 2>&1 | grep -v "^warming" | tail -4 | tee "$out/latency.log"
