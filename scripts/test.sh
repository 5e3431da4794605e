#!/usr/bin/env bash
# Set up and run the test suite (what CI runs). Extra args go to pytest.
#
#   bash scripts/test.sh [--quick] [pytest args...]
#
# --quick: in a checkout that is set up already, ruff, then the tests listed in tests/quick.txt
# (every package's fast unit and invariant tests, one real sandbox test per installed backend, no
# training runs); the docker backend's test runs when Podman (or DOCKER_HOST) and the sandbox image
# are already there. The full suite (2 pytest workers) took 12.5 min on 2 cores at load 1.4-4.2 in a
# set-up clone (pytest 9 min, the docker stage 2.75 min; 1022 CPU-seconds).
#
# Every process the run starts inherits COMPACTRL_TEST_RUN (podman's conmon processes carry this
# run's CONTAINERS_CONF instead); at the end, any such process still alive fails the run. Temporary
# files (pytest's tmp_path, sandbox session dirs, servers' record dirs, matplotlib's cache) go to one
# directory under $TMPDIR, removed when the run passes and kept, with its path printed, when not.
set -uo pipefail
cd "$(dirname "$0")/.."
QUICK=0
if [[ "${1:-}" == "--quick" ]]; then QUICK=1; shift; fi
export COMPACTRL_TEST_RUN="${COMPACTRL_TEST_RUN:-$(date +%s)-$$}"
RUN_TMP=$(mktemp -d "${TMPDIR:-/tmp}/compactrl-test.$COMPACTRL_TEST_RUN.XXXXXX") || exit 1
export TMPDIR="$RUN_TMP" MPLCONFIGDIR="$RUN_TMP/matplotlib"
# The vLLM engine's compiled kernels (torch inductor) are cached where they are outside tests (torch's
# default is under $TMPDIR, fresh per run here): a run reuses what an earlier run compiled.
export TORCHINDUCTOR_CACHE_DIR="${TORCHINDUCTOR_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/compactrl/torchinductor}"

quick() {
  # a fresh checkout is set up first (no apt: the real backends run only where already installed)
  .venv/bin/python -c "import compactrl" 2>/dev/null || bash scripts/setup.sh || return 1
  .venv/bin/ruff check compactrl tests benchmarks examples scripts || return 1
  .venv/bin/python scripts/check_class_duplicates.py || return 1
  local entries
  mapfile -t entries < <(sed -e 's/#.*//' -e 's/[[:space:]]*$//' tests/quick.txt | grep -v '^-' | grep .)
  # the slowest tests named at the end: what to look at when the quick mode stops being quick
  .venv/bin/python -m pytest -m "not slow and not gpu and not docker" --durations=10 "${entries[@]}" "$@" \
    || return $?
  local image=${COMPACTRL_SANDBOX_IMAGE:-compactrl-sandbox:latest}
  if [[ -n "${DOCKER_HOST:-}" ]] || { command -v podman && command -v runc && command -v debootstrap \
       && podman image exists "$image"; } >/dev/null 2>&1; then
    bash scripts/ci_docker.sh tests/sandbox/test_sandbox_shell.py::test_run_tests_reports_per_test_verdicts_and_hides_hidden_files "$@"
  else
    echo "test.sh --quick: no Podman with the image $image and no DOCKER_HOST: the docker backend's test is skipped"
  fi
}

# pytest-xdist's options for the full suite: COMPACTRL_TEST_WORKERS processes (default 2; 1 = one
# process, no xdist). Each test file runs whole on one worker (its fixtures start once), the longest
# files first (tests/conftest.py orders them); the suite checks the same things either way.
workers() {
  local n=${COMPACTRL_TEST_WORKERS:-2}
  [[ $n =~ ^[1-9][0-9]*$ ]] || { echo "test.sh: COMPACTRL_TEST_WORKERS must be a positive integer, got '$n'" >&2; return 1; }
  if [[ $n -gt 1 ]] && .venv/bin/python -c "import xdist" 2>/dev/null; then echo "-n $n --dist loadfile --no-loadscope-reorder"; fi
}

run() {
  [[ $QUICK == 0 ]] || { quick "$@"; return $?; }
  bash scripts/setup.sh --system || return 1
  bash scripts/setup.sh --vllm || return 1  # the vLLM engine's own environment (tests/vllm)
  .venv/bin/ruff check compactrl tests benchmarks examples scripts || return 1
  .venv/bin/python scripts/check_class_duplicates.py || return 1
  local xdist
  xdist=$(workers) || return 1
  # shellcheck disable=SC2086  # $xdist: zero or more options
  .venv/bin/python -m pytest -m "not slow and not gpu and not docker" $xdist "$@" || return $?
  # The `docker` tests against a real engine (Podman's socket; built and started by the script).
  bash scripts/ci_docker.sh "$@"
}
run "$@"
rc=$?
env -u COMPACTRL_TEST_RUN "${PYTHON:-python3}" scripts/check_leftover_processes.py --wait 10 \
  "COMPACTRL_TEST_RUN=$COMPACTRL_TEST_RUN" "CONTAINERS_CONF=$RUN_TMP/compactrl-podman.$COMPACTRL_TEST_RUN.*" \
  || { echo "test.sh: the processes above outlived the test run" >&2; [[ $rc != 0 ]] || rc=1; }
if [[ $rc == 0 ]]; then rm -rf "$RUN_TMP"; else echo "test.sh: exit $rc; temporary files kept in $RUN_TMP" >&2; fi
exit $rc
