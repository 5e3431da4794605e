#!/usr/bin/env bash
# Set up and run the test suite (what CI runs). Extra args go to pytest.
#
# Every process the run starts inherits COMPACTRL_TEST_RUN (podman's conmon processes carry this
# run's CONTAINERS_CONF instead); at the end, any such process still alive fails the run.
set -uo pipefail
cd "$(dirname "$0")/.."
export COMPACTRL_TEST_RUN="${COMPACTRL_TEST_RUN:-$(date +%s)-$$}"
bash scripts/setup.sh --system || exit 1
.venv/bin/ruff check compactrl tests benchmarks examples scripts || exit 1
.venv/bin/python scripts/check_class_duplicates.py || exit 1
.venv/bin/python -m pytest -m "not slow and not gpu and not docker" "$@"
rc=$?
# The `docker` tests against a real engine (Podman's socket; built and started by the script).
if [[ $rc == 0 ]]; then
  bash scripts/ci_docker.sh "$@"
  rc=$?
fi
env -u COMPACTRL_TEST_RUN .venv/bin/python scripts/check_leftover_processes.py --wait 10 \
  "COMPACTRL_TEST_RUN=$COMPACTRL_TEST_RUN" "CONTAINERS_CONF=${TMPDIR:-/tmp}/compactrl-podman.$COMPACTRL_TEST_RUN.*" \
  || { echo "test.sh: the processes above outlived the test run" >&2; [[ $rc != 0 ]] || rc=1; }
exit $rc
