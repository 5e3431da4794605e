#!/usr/bin/env bash
# Set up compactrl in ./.venv (idempotent). Usage: bash scripts/setup.sh [--system]
#   --system  also install the system packages the real sandboxes use (bubblewrap, podman, runc,
#             debootstrap); needs root and apt. Without it, tests that need them skip with a reason.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [[ "${1:-}" == "--system" ]]; then
  if command -v apt-get >/dev/null && [[ $(id -u) == 0 ]]; then
    missing=()
    for p in bubblewrap podman runc debootstrap; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
    if ((${#missing[@]})); then
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    fi
  else
    echo "setup: --system needs root and apt-get; skipping system packages" >&2
  fi
fi
[[ -x .venv/bin/python ]] || "$PY" -m venv .venv
# torch 2.13.0 (CPU build) first: see README "Install" for why this pair.
.venv/bin/pip install -q --disable-pip-version-check "torch==2.13.0" 2>&1 | grep -v "is ignored" || true
.venv/bin/pip install -q --disable-pip-version-check -e ".[test,docker]" 2>&1 | grep -v "is ignored" || true
.venv/bin/python -c "import compactrl, torch, torchrl; print('compactrl', compactrl.__version__, '| torch', torch.__version__, '| torchrl', torchrl.__version__)"
