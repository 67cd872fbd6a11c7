#!/usr/bin/env bash
# The pipecat bots of bench.agents on the lent GPU (bench/gpu_agents.sh), which has no network: pipecat-ai and what
# importing and running harness.pipecat_bot needs beyond the GPU image (the package list of the device's KINDS.md)
# and beyond .whl/ (bash bench/glass_bundle.sh --wheels: av, aiortc and theirs, soxr, pyzmq), as cp312 wheels.
#
# Usage (here, from the repo root):  bash bench/agents_bundle.sh
#
# Into .carry/agents (ignored by git: /.carry/ is in .git/info/exclude), pinned to constraints-integrations.txt. Only
# what the bot imports: found by importing and running it in a venv holding nothing but the image's packages and
# .whl/. pipecat-ai's other requirements (openai, numba, onnxruntime, resampy, soundfile, python-dotenv, num2words, ...)
# are imported by services the bot does not use, or are in the image already.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
dest=.carry/agents
packages=(pipecat-ai loguru wait-for2 docstring-parser pydantic pydantic-core typing-inspection annotated-types
    loudness sentencex websockets)
pins=()
for name in "${packages[@]}"; do
    pin=$(grep -i "^${name}==" constraints-integrations.txt) || { echo "$name is not pinned in constraints-integrations.txt" >&2; exit 1; }
    pins+=("$pin")
done
rm -rf "$dest"
mkdir -p "$dest"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 -d "$dest" "${pins[@]}"

mib() { echo "scale=1; $1 / 1048576" | bc; }
agents=$(du -sb "$dest" | cut -f1)
glass=$( (du -sb .carry/glass 2>/dev/null || echo 0) | cut -f1)
avatar=$( (du -sb .carry/avatars/demo 2>/dev/null || echo 0) | cut -f1)
tree=$(git ls-files -co --exclude-standard -z | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)
ls "$dest"
echo "carry: .carry/agents $(mib "$agents") MiB, .carry/glass $(mib "$glass") MiB, .carry/avatars/demo" \
    "$(mib "$avatar") MiB, working tree $(mib "$tree") MiB; total $(mib $((agents + glass + avatar + tree))) MiB of the" \
    "64 MiB one call carries"
