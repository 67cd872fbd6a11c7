#!/usr/bin/env bash
# The live-output targets on the lent GPU: glass-to-glass latency, and 8 RTMP sessions for 10 minutes.
# Carry .whl (av, aiortc and their dependencies: bash bench/glass_bundle.sh --wheels) and .carry/glass (nginx).
# Usage there (results and logs under $OUT):
#   bash bench/gpu_glass.sh latency AVATAR_DIR    one call, about 5 minutes with a cold compile cache
#   bash bench/gpu_glass.sh sessions AVATAR_DIR   starts the 10-minute run detached, follows it for 9 minutes
#   bash bench/gpu_glass.sh collect               the next call, at once: waits for that run, returns its results
set -uo pipefail
mode=${1:?latency, sessions or collect}
source bench/gpu_env.sh
# The bundled nginx opens its compiled-in access log (/var/log/nginx) at start even without an http block.
mkdir -p /var/log/nginx
runs=/tmp/glass-runs
mkdir -p "$runs"
case $mode in
latency)
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt"
    timeout 570 python3 -m bench.glass_to_glass --avatar "${2:?cached avatar folder}" --viewer aiortc --utterances 20 \
        --out "$out/glass_to_glass.json" 2>&1 | grep -v "warming up" | tail -30
    ;;
sessions)
    setsid nohup python3 -m bench.rtmp_sessions --avatar "${2:?cached avatar folder}" --sessions 8 --minutes 10 \
        --out "$runs/rtmp_sessions.json" >"$runs/rtmp_sessions.log" 2>&1 </dev/null &
    echo $! >"$runs/pid"
    while kill -0 "$(cat "$runs/pid")" 2>/dev/null && ((SECONDS < 540)); do sleep 10; done
    grep -v "warming up" "$runs/rtmp_sessions.log" | tail -5
    echo "still running: call 'bash bench/gpu_glass.sh collect' now, before the machine is given back"
    ;;
collect)
    while kill -0 "$(cat "$runs/pid")" 2>/dev/null && ((SECONDS < 570)); do sleep 5; done
    cp "$runs"/rtmp_sessions* "$out"/
    grep -v "warming up" "$runs/rtmp_sessions.log" | tail -20
    ;;
*)
    echo "unknown mode $mode: latency, sessions or collect" >&2
    exit 2
    ;;
esac
