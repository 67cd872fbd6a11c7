# Sourced by the bench/gpu_*.sh scripts on the lent GPU: carried wheels on the path, caches, $out.
out=${OUT:-/tmp/out}
mkdir -p "$out"
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site:$PWD
fi
export DITTO_CACHE_DIR=/tmp/ditto-cache PYTHONUNBUFFERED=1
since() { python3 -c "print(round($EPOCHREALTIME - $1, 2))"; }
