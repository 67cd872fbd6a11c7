#!/usr/bin/env bash
# Everything `bash bench/gpu_agents.sh voice` needs, small enough for one call's 64 MiB: the wheels of .whl/ and
# .carry/agents unpacked into one tree, and .carry/glass with .carry/avatars/demo, each as an xz archive (xz of the
# unpacked files is about a third smaller than the wheels' zip, which is what lets them travel together). pipecat's
# bundled turn and VAD models are left out: the bots use neither.
#
# Usage (here, from the repo root, after bench/glass_bundle.sh --wheels, bench/agents_bundle.sh and a registered
# .carry/avatars/demo):  bash bench/voice_bundle.sh      then carry .carry/voice
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
dest=.carry/voice
for need in .whl .carry/agents .carry/glass .carry/avatars/demo/manifest.json; do
    [[ -e $need ]] || { echo "$need is missing: see this script's usage" >&2; exit 1; }
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for wheel in .whl/*.whl .carry/agents/*.whl; do
    python3 -m zipfile -e "$wheel" "$work/site"
done
find "$work/site/pipecat/audio" -name "*.onnx" -delete
rm -rf "$dest"
mkdir -p "$dest"
tar -C "$work/site" -cf - . | xz -T0 -9 >"$dest/site.tar.xz"
tar -cf - .carry/glass .carry/avatars/demo | xz -T0 -9 >"$dest/tree.tar.xz"
tree=$(git ls-files -co --exclude-standard -z | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)
carry=$(du -cb "$dest"/* | tail -1 | cut -f1)
ls -l "$dest"
echo "carry .carry/voice: $((carry / 1048576)) MiB, with the working tree $(((carry + tree) / 1048576)) MiB of the 64 MiB"
