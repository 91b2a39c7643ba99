#!/usr/bin/env bash
# Installs the PyTorch build that fits this machine into the current Python (`python3 -m pip`, or
# $PYTHON), before `pip install -e .`, so the package's own `torch` requirement is already met:
#
#   - torch already importable and in the package's range: left as it is;
#   - an NVIDIA GPU (`nvidia-smi -L` lists one): the default build from PyPI, which brings CUDA with
#     it (about 3 GB of nvidia wheels);
#   - no NVIDIA GPU: the CPU build from PyTorch's CPU index, https://download.pytorch.org/whl/cpu
#     (about 200 MB, no nvidia packages). Only torch itself comes from there (`--no-deps`, and no
#     other index is asked for it, since PyPI's torch is the CUDA build); its small dependencies
#     come from your usual index with the package.
#
# CUDA_AGENT_TORCH_INDEX=URL installs torch from that index instead (e.g.
# https://download.pytorch.org/whl/cu126 for an older driver). Nothing outside the Python
# environment is changed.
set -euo pipefail

PYTHON=${PYTHON:-python3}
RANGE="torch>=2.4,<2.15"   # as in pyproject.toml

if "$PYTHON" - <<'EOF' 2>/dev/null
import sys
import torch
major, minor = (int(x) for x in torch.__version__.split(".")[:2])
sys.exit(0 if (2, 4) <= (major, minor) < (2, 15) else 1)
EOF
then
  echo "install-torch: torch $("$PYTHON" -c 'import torch; print(torch.__version__)') is installed; leaving it"
  exit 0
fi

if [[ -n "${CUDA_AGENT_TORCH_INDEX:-}" ]]; then
  echo "install-torch: torch from $CUDA_AGENT_TORCH_INDEX (CUDA_AGENT_TORCH_INDEX)"
  "$PYTHON" -m pip install "$RANGE" --index-url "$CUDA_AGENT_TORCH_INDEX"
elif command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
  echo "install-torch: an NVIDIA GPU is present: torch's default (CUDA) build from PyPI, ~3 GB"
  "$PYTHON" -m pip install "$RANGE"
else
  # pip's own configuration wins: an index the user configured (PIP_INDEX_URL, `pip config`) is
  # asked first, as every other package of the install is; PyTorch's CPU index otherwise, tried
  # once (an unreachable host costs seconds, not five retries), then pip's configured sources.
  configured=${PIP_INDEX_URL:-$("$PYTHON" -m pip config get global.index-url 2>/dev/null || true)}
  if [[ -n "$configured" ]]; then
    echo "install-torch: no NVIDIA GPU: torch from pip's configured index $configured"
    "$PYTHON" -m pip install "$RANGE"
  else
    echo "install-torch: no NVIDIA GPU: torch's CPU build from https://download.pytorch.org/whl/cpu, ~200 MB"
    # An empty PIP_EXTRA_INDEX_URL keeps configured extra indexes out of this one install (they may
    # offer PyPI's CUDA build at a higher version); configured --find-links folders still count.
    if ! PIP_EXTRA_INDEX_URL=" " "$PYTHON" -m pip install --no-deps --retries 0 --timeout 20 "$RANGE" \
        --index-url https://download.pytorch.org/whl/cpu; then
      echo "install-torch: PyTorch's CPU index could not be used; torch from pip's configured sources" >&2
      "$PYTHON" -m pip install --no-deps "$RANGE"
    fi
    # Its dependencies (filelock, sympy, networkx, jinja2, fsspec, typing-extensions) from the usual
    # indexes: the build just installed satisfies the pin, so it stays.
    version=$("$PYTHON" -m pip show torch | sed -n 's/^Version: //p')
    "$PYTHON" -m pip install "torch==$version"
  fi
fi
"$PYTHON" -W ignore -c 'import torch; print("install-torch: torch", torch.__version__, "CUDA", torch.version.cuda or "none (CPU build)")'
