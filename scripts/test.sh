#!/usr/bin/env bash
# Set up and run the test suite (what CI runs). Extra args go to pytest.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --system || exit 1
.venv/bin/ruff check compactrl tests benchmarks examples scripts || exit 1
.venv/bin/python -m pytest -m "not slow and not gpu and not docker" "$@" || exit $?
# The `docker` tests against a real engine (Podman's socket; built and started by the script).
bash scripts/ci_docker.sh "$@"
