#!/usr/bin/env bash
# Wheels for a CUDA machine that cannot reach a package registry (the H200 image this project's GPU
# figures come from has torch, transformers, rich, typer, httpx and pytest, but not these; openai 3
# needs httpx2 and httpcore2):
#   bash benchmarks/gpu/device_wheels.sh [DIR]        (default: .whl, which git ignores)
# device_gpu.sh and train_gpu.sh install every wheel in .whl before they run. The versions are the
# ones installed here, so the GPU runs the code paths this machine's tests ran; a package missing
# here is fetched at PyPI's newest. Python 3.12 / manylinux x86-64, as on that image.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
dir=${1:-.whl}
mkdir -p "$dir"
packages=(pydantic pydantic-core annotated-types typing-inspection openai jiter distro sniffio httpx2 httpcore2 truststore anyio h11 idna)
specs=()
for name in "${packages[@]}"; do
  version=$(python3 -c "import importlib.metadata as m, sys
try: print(m.version(sys.argv[1]))
except m.PackageNotFoundError: pass" "$name")
  specs+=("$name${version:+==$version}")
done
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
  platforms+=(--platform "$p")
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${platforms[@]}" -d "$dir" "${specs[@]}"
ls -1 "$dir"
du -sh "$dir"
