#!/usr/bin/env bash
# GPU memory of runtimes on the lent GPU (docs/memory.md), in one call of under 10 min (carry .whl and .carry/avatars):
#   bash bench/gpu_memory.sh AVATAR [RUN...]
# builds the torch backend's compiled packages into /tmp/plans unless they are there (kept while the machine stays
# warm), then each RUN in turn, each writing memory_RUN.json and its log, packed into $OUT/memory_runs.tgz at the end:
#   full      bench.runtime --memory-only on a runtime sized for every bucket, then one live session
#   one       the same, sized for one session
#   sixteen   the same, sized for 16 sessions, then 8 and 16 live sessions
#   eight     eight one-session runtimes in eight processes side by side, each one live session for 20 s,
#             nvidia-smi sampled every second meanwhile
set -uo pipefail
source bench/gpu_env.sh
plans=/tmp/plans
runs=/tmp/memory-runs
mkdir -p "$runs"
avatar=${1:?cached avatar folder}
shift
checkpoints=$DITTO_CACHE_DIR/random-weights-seed0
if ! compgen -G "$plans/torch-aot-*/manifest.json" >/dev/null; then
    python3 -c "from engine.engine import random_checkpoints; random_checkpoints()"
    start=$EPOCHREALTIME
    python3 -m compile.build_plans --checkpoints "$checkpoints" --random-weights --aot only --out "$plans" --aot-jobs 6 \
        >"$runs/aot_build.log" 2>&1 || { tail -c 2000 "$runs/aot_build.log"; exit 1; }
    echo "packages built in $(since "$start") s"
fi
runtime() {  # NAME SIZE ARGS...: bench.runtime sized for SIZE sessions ("" for every bucket)
    local name=$1 size=$2
    shift 2
    python3 -m bench.runtime --avatar "$avatar" --plans "$plans" ${size:+--runtime-sessions $size} "$@" \
        --out "$runs/memory_$name.json" >"$runs/memory_$name.log" 2>&1
    grep -E "^\| |^start|^memory|^\{" "$runs/memory_$name.log" | cut -c1-400
}
for run in "$@"; do
    echo "== $run"
    case $run in
    full) runtime full "" --memory-only; runtime full_live "" --live-only --sessions 1 --seconds 10 ;;
    one) runtime one 1 --memory-only; runtime one_live 1 --live-only --sessions 1 --seconds 10 ;;
    sixteen) runtime sixteen 16 --memory-only; runtime sixteen_live 16 --live-only --sessions 8 16 --seconds 10 ;;
    eight)
        nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -l 1 >"$runs/eight_smi.txt" &
        smi=$!
        for i in 1 2 3 4 5 6 7 8; do
            python3 -m bench.runtime --avatar "$avatar" --plans "$plans" --runtime-sessions 1 --live-only --sessions 1 \
                --seconds 20 --out "$runs/eight_$i.json" >"$runs/eight_$i.log" 2>&1 &
        done
        wait $(jobs -p | grep -v "^$smi$")
        kill $smi
        for i in 1 2 3 4 5 6 7 8; do grep -E "^\{|Error|error" "$runs/eight_$i.log" | tail -2 | cut -c1-300; done
        echo "device memory used, most: $(sort -n "$runs/eight_smi.txt" | tail -1) MiB"
        ;;
    *) echo "unknown run $run" >&2 ;;
    esac
done
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >"$runs/gpu.txt"
tar czf "$out/memory_runs.tgz" -C /tmp memory-runs
