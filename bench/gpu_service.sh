#!/usr/bin/env bash
# The service targets on the lent GPU: first picture, create/delete cycles, 12 streams for 10 min, 16 for 3.
# Carry .whl (bash bench/glass_bundle.sh --wheels), .carry/glass (nginx) and .carry/avatars (a registered avatar).
# Usage there (results and logs under $OUT):
#   bash bench/gpu_service.sh prepare                      carry .whl and .carry/glass: the wheels into /tmp/site and
#                                                          the torch backend's packages built into /tmp/plans (6
#                                                          processes, ~2.5 min); `start` then runs on them
#   bash bench/gpu_service.sh start [bench.service args]   starts the run detached, follows it for 9 minutes
#   bash bench/gpu_service.sh follow                       the next call, at once: follows it for 9.5 more minutes
#   bash bench/gpu_service.sh soak bench.soak args         instead of start: bench.soak (on the packages when built)
#                                                          detached, followed the same (bench/README.md: the command)
#   bash bench/gpu_service.sh soak-fresh MINUTES           one call on a fresh machine (carry .carry/voice, bash
#                                                          bench/voice_bundle.sh): the packages built, then bench.soak
#                                                          with 12 sessions of the demo avatar for MINUTES, memory
#                                                          counted from its second minute, followed to 9.5 minutes
#   bash bench/gpu_service.sh collect                      waits for the run (9.5 min at most), returns its results
#   bash bench/gpu_service.sh after                        then, on the warm compile cache: the runtime alone at 12
#                                                          sessions (the loop CPU baseline) and glass-to-glass
# Each call follows for up to 9.5 minutes: give every call timeout_s 600, or it is killed before it copies
# anything back (what happened once). 12 streams x 10 min + 16 x 3 min with a cold compile cache is ~21 min.
set -uo pipefail
mode=${1:?prepare, start, soak, soak-fresh, follow, collect or after}
source bench/gpu_env.sh
mkdir -p /var/log/nginx
plans=/tmp/plans
runs=/tmp/service-runs
mkdir -p "$runs"
follow() {  # the run that start or soak began: its name (service, soak) is in $runs/name
    local limit=$1 name
    name=$(cat "$runs/name")
    while kill -0 "$(cat "$runs/pid")" 2>/dev/null && ((SECONDS < limit)); do sleep 5; done
    grep -v "warming up\|aiohttp.access" "$runs/$name.log" | tail -12
    cp "$runs/$name"* "$out"/ 2>/dev/null
    kill -0 "$(cat "$runs/pid")" 2>/dev/null && echo "still running: call 'bash bench/gpu_service.sh follow' (or collect) now"
}
detached() {  # NAME MODULE ARGS...: run python3 -m MODULE ARGS --out $runs/NAME.json detached, its log $runs/NAME.log
    local name=$1 module=$2
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$runs/${name}_gpu.txt"
    packages=()
    has_plans && packages=(--plans "$plans")
    echo "$name" >"$runs/name"
    setsid nohup python3 -m "$module" "${packages[@]}" --out "$runs/$name.json" "${@:3}" >"$runs/$name.log" 2>&1 </dev/null &
    echo $! >"$runs/pid"
}
case $mode in
prepare)
    has_plans || build || exit 1
    python3 -c "import apps.serve, serving.service, engine.engine, bench.service, bench.soak"  # bytecode for the next call
    echo "prepared after $SECONDS s: call 'bash bench/gpu_service.sh start ...' within 30 s (the machine stays warm)"
    ;;
start)
    detached service bench.service --avatar .carry/avatars/demo "${@:2}"
    follow 540
    ;;
soak)
    detached soak bench.soak "${@:2}"
    follow 540
    ;;
soak-fresh)
    has_plans || build || exit 1
    detached soak bench.soak --avatar .carry/avatars/demo --sessions 12 --minutes "${2:?minutes}" --warm-minutes 1
    follow 570
    ;;
follow) follow 570 ;;
collect) follow 570 ;;
after)
    timeout 200 python3 -m bench.runtime --avatar .carry/avatars/demo --live-only --sessions 12 --seconds 30 \
        --out "$out/runtime_12.json" 2>&1 | grep -v "warming up" | tail -6
    timeout $((570 - SECONDS)) python3 -m bench.glass_to_glass --avatar .carry/avatars/demo --viewer aiortc --utterances 20 \
        --out "$out/glass_to_glass.json" 2>&1 | grep -v "warming up" | tail -20
    ;;
*)
    echo "unknown mode $mode: prepare, start, soak, soak-fresh, follow, collect or after" >&2
    exit 2
    ;;
esac
