#!/usr/bin/env bash
# GPU memory of runtimes on the lent GPU (docs/memory.md), in one call of under 10 min (carry .whl and .carry/avatars):
#   bash bench/gpu_memory.sh AVATAR [RUN...]
# builds the torch backend's compiled packages into /tmp/plans unless they are there (kept while the machine stays
# warm, or carried back as .carry/plans.tgz, a tar of plans/ made by an earlier call), then each RUN in turn, each
# writing memory_RUN.json and its log, packed into $OUT/memory_runs.tgz after each run:
#   full        bench.runtime --memory-only on a runtime with every bucket, then one live session
#   one         the same, sized for one session
#   sixteen     bench.runtime sized for 16 sessions: independence (PSNR, bit-identity), memory, 8 and 16 live sessions
#   fixed       one and sixteen's memory with the allocator's fixed-size segments (expandable_segments:False)
#   eight_mps   eight as above, under the CUDA multi-process service (kernels of several processes at once)
#   squeeze     another process holds all but 6 GiB of the GPU: a start for 16 sessions must fail in one line,
#               one for a single session start
#   eight     eight one-session runtimes in eight processes side by side, each one live session for 20 s,
#             nvidia-smi sampled every second meanwhile
set -uo pipefail
source bench/gpu_env.sh
plans=/tmp/plans
runs=/tmp/memory-runs
mkdir -p "$runs"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >"$runs/gpu.txt"
avatar=${1:?cached avatar folder}
shift
checkpoints=$DITTO_CACHE_DIR/random-weights-seed0
[ -f .carry/plans.tgz ] && [ ! -d "$plans" ] && tar xzf .carry/plans.tgz -C /tmp
if ! compgen -G "$plans/torch-aot-*/manifest.json" >/dev/null; then
    python3 -c "from engine.engine import random_checkpoints; random_checkpoints()"
    start=$EPOCHREALTIME
    python3 -m compile.build_plans --checkpoints "$checkpoints" --random-weights --aot only --out "$plans" \
        --aot-jobs 6 >"$runs/aot_build.log" 2>&1 || { tail -c 2000 "$runs/aot_build.log"; exit 1; }
    echo "packages built in $(since "$start") s"
fi
runtime() {  # NAME SIZE ARGS...: bench.runtime sized for SIZE sessions ("" for every bucket)
    local name=$1 size=$2
    shift 2
    python3 -m bench.runtime --avatar "$avatar" --plans "$plans" ${size:+--runtime-sessions $size} "$@" \
        --out "$runs/memory_$name.json" >"$runs/memory_$name.log" 2>&1
    grep -E "^\| |^start|^memory|^error|^\{" "$runs/memory_$name.log" | cut -c1-400
}
for run in "$@"; do
    echo "== $run"
    case $run in
    full) runtime full "" --memory-only; runtime full_live "" --live-only --sessions 1 --seconds 10 ;;
    one) runtime one 1 --memory-only; runtime one_live 1 --live-only --sessions 1 --seconds 10 ;;
    sixteen) runtime sixteen 16 --sessions 8 16 --seconds 10 ;;
    fixed)
        PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False runtime one_fixed 1 --memory-only
        PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False runtime sixteen_fixed 16 --memory-only
        ;;
    squeeze)
        python3 -c "import torch, time; free = torch.cuda.mem_get_info()[0]; x = torch.empty(free - 6 * 2**30, \
            dtype=torch.uint8, device='cuda'); print('holding', x.numel() >> 30, 'GiB', flush=True); time.sleep(90)" &
        hog=$!
        sleep 15
        runtime squeeze_sixteen 16 --start-only
        runtime squeeze_one 1 --start-only
        kill $hog
        ;;
    eight | eight_mps)
        if [ "$run" = eight_mps ]; then
            export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
            mkdir -p /tmp/mps /tmp/mps-log && nvidia-cuda-mps-control -d || { echo "no MPS here"; continue; }
        fi
        nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -l 1 >"$runs/${run}_smi.txt" &
        smi=$!
        for i in 1 2 3 4 5 6 7 8; do
            timeout 150 python3 -m bench.runtime --avatar "$avatar" --plans "$plans" --runtime-sessions 1 \
                --live-only --sessions 1 --seconds 20 --out "$runs/${run}_$i.json" >"$runs/${run}_$i.log" 2>&1 &
        done
        wait $(jobs -p | grep -v "^$smi$")
        kill $smi
        for i in 1 2 3 4 5 6 7 8; do grep -E "^\{|Error|error" "$runs/${run}_$i.log" | tail -2 | cut -c1-300; done
        echo "device memory used, most: $(sort -n "$runs/${run}_smi.txt" | tail -1) MiB"
        [ "$run" = eight_mps ] && echo quit | nvidia-cuda-mps-control
        ;;
    *) echo "unknown run $run" >&2 ;;
    esac
    tar czf "$out/memory_runs.tgz" -C /tmp memory-runs  # after each run: a call stopped at its limit keeps the rest
done
