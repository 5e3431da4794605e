#!/usr/bin/env bash
# Run the tests marked `docker` against a real engine: Podman's Docker-compatible socket.
#
#   bash scripts/ci_docker.sh [pytest args...]
#
# 1. installs podman, runc and debootstrap if missing (apt, root only);
# 2. builds the default sandbox image offline from registries, if it is not there yet:
#    `debootstrap --variant=minbase` (Debian packages only) with python3 + pytest, then
#    `podman import` as compactrl-sandbox:latest;
# 3. writes a containers.conf (runtime runc, cgroupfs, lowered default ulimits, a short exec exit
#    delay) used only by this run through CONTAINERS_CONF, and starts `podman system service` on its
#    own socket;
# 4. runs `pytest -m docker` with DOCKER_HOST pointing at that socket; on exit removes the containers
#    the tests left, stops the service and waits until this run's conmon processes are gone.
#
# With DOCKER_HOST already set (a Docker Engine, say), steps 1-3 are skipped and that engine is used
# (it must hold the image; build one with the rootfs this script leaves in $CACHE). Where nothing can
# be set up (not root, no apt), the docker tests run anyway and skip, saying why.
set -uo pipefail
cd "$(dirname "$0")/.."
IMAGE=${COMPACTRL_SANDBOX_IMAGE:-compactrl-sandbox:latest}
SOCK=${COMPACTRL_PODMAN_SOCK:-/run/compactrl-podman.sock}
CACHE=${COMPACTRL_CACHE:-/var/cache/compactrl}
SUITE=${COMPACTRL_DEBIAN_SUITE:-bookworm}
# The Debian mirror this machine's apt already uses (first main archive URI in its sources).
apt_mirror() {
  { grep -hs '^URIs:' /etc/apt/sources.list.d/*.sources | awk '{print $2}'
    grep -hs '^deb ' /etc/apt/sources.list | awk '{print $2}'; } | grep -v -- '-security' | head -n 1
}
MIRROR=${COMPACTRL_DEBIAN_MIRROR:-$(apt_mirror)}
PY=.venv/bin/python
# Podman keeps one conmon process per `exec` session alive for exit_command_delay seconds after the
# command ends (default 300, mimicking Docker's exec inspection window): a test run makes ~500 execs,
# i.e. ~1,000 conmon processes (~1.6 GiB) alive for 5 minutes after it exits. The exit code is read
# right after the stream ends (exec_inspect), so a few seconds are plenty.
EXIT_DELAY=${COMPACTRL_PODMAN_EXIT_DELAY:-5}
log() { echo "ci_docker: $*" >&2; }

run_tests() {
  "$PY" -m pytest -m "docker and not gpu" "$@"
  local rc=$?
  # 5 = nothing collected: the given paths hold no docker test (the main run checks for 5 itself)
  if [[ $rc == 5 ]]; then log "no docker tests selected"; return 0; fi
  return $rc
}

if [[ -n "${DOCKER_HOST:-}" ]]; then
  log "DOCKER_HOST=$DOCKER_HOST is set: using that engine as it is"
  run_tests "$@"
  exit $?
fi
if [[ $(id -u) != 0 ]]; then
  log "not root: cannot install or run rootful podman here; the docker tests will skip"
  run_tests "$@"
  exit $?
fi

missing=()
command -v podman >/dev/null || missing+=(podman)
command -v runc >/dev/null || missing+=(runc)
command -v debootstrap >/dev/null || missing+=(debootstrap)
if ((${#missing[@]})); then
  if command -v apt-get >/dev/null; then
    log "installing ${missing[*]}"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
fi
if ! command -v podman >/dev/null || ! command -v runc >/dev/null; then
  log "podman/runc unavailable (no apt?): the docker tests will skip"
  run_tests "$@"
  exit $?
fi

mkdir -p "$CACHE"
# A per-run file: podman passes CONTAINERS_CONF on to every conmon it starts (conmon drops other
# variables and leaves the process tree), so its value identifies this run's processes at cleanup.
# (scripts/test.sh looks for CONTAINERS_CONF=$TMPDIR/compactrl-podman.$COMPACTRL_TEST_RUN.*)
RUN_DIR=$(mktemp -d "${TMPDIR:-/tmp}/compactrl-podman.${COMPACTRL_TEST_RUN:-$$}.XXXXXX")
export CONTAINERS_CONF="$RUN_DIR/containers.conf"
# runc: crun is not always installed; cgroupfs: no systemd here; the default nofile/nproc
# ulimits podman asks for exceed what a nested host grants, which makes every `run` fail.
cat >"$CONTAINERS_CONF" <<EOF
[containers]
default_ulimits = ["nofile=4096:4096", "nproc=4096:4096"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
exit_command_delay = $EXIT_DELAY
EOF
service_pid=
cleanup() {
  local rc=$?
  if [[ -n "$service_pid" ]]; then
    # the tests remove their containers; these are the ones a crashed or killed test left
    DOCKER_HOST="unix://$SOCK" "$PY" -c "import docker
from compactrl.sandbox.docker import reap_stale_containers
n = len(reap_stale_containers(docker.from_env(timeout=30)))
if n:
    print(f'ci_docker: removed {n} container(s) left by the tests')" >&2
    kill "$service_pid" 2>/dev/null
    wait "$service_pid" 2>/dev/null
    rm -f "$SOCK"
  fi
  # conmon processes of the last exec sessions end EXIT_DELAY s after their command; wait for them
  "$PY" scripts/check_leftover_processes.py --wait $((EXIT_DELAY + 30)) --kill "CONTAINERS_CONF=$CONTAINERS_CONF" \
    || rc=1
  rm -rf "$RUN_DIR"
  exit $rc
}
trap cleanup EXIT

if ! podman image exists "$IMAGE"; then
  rootfs="$CACHE/rootfs-$SUITE"
  start=$(date +%s)
  if [[ ! -x "$rootfs/usr/bin/python3" ]]; then
    log "building $IMAGE: debootstrap $SUITE (minbase + python3, pytest) into $rootfs"
    rm -rf "$rootfs"
    if ! debootstrap --variant=minbase --include=python3,python3-pytest,python-is-python3,procps \
        "$SUITE" "$rootfs" "$MIRROR" >"$CACHE/debootstrap.log" 2>&1; then
      log "debootstrap failed (see $CACHE/debootstrap.log): the docker tests will skip"
      run_tests "$@"
      exit $?
    fi
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* \
      "$rootfs"/usr/share/doc "$rootfs"/usr/share/man "$rootfs"/usr/share/locale
  fi
  tar -C "$rootfs" -c . | podman import --change 'CMD ["/bin/bash"]' - "$IMAGE" >/dev/null || {
    log "podman import failed"; exit 1; }
  log "built $IMAGE in $(($(date +%s) - start)) s"
fi

rm -f "$SOCK"
podman system service --time=0 "unix://$SOCK" >"$CACHE/podman-service.log" 2>&1 &
service_pid=$!
for _ in $(seq 100); do [[ -S "$SOCK" ]] && break; sleep 0.1; done
[[ -S "$SOCK" ]] || { log "podman system service did not come up (see $CACHE/podman-service.log)"; exit 1; }
export DOCKER_HOST="unix://$SOCK"
log "engine: podman $(podman --version | awk '{print $3}') at $DOCKER_HOST"
# The Debian 12 root that base-image family substitutes start from (debootstrap, cached in $CACHE and
# the engine), made here so that the tests download nothing; the tests that need it skip without it.
start=$(date +%s)
if COMPACTRL_CACHE="$CACHE" "$PY" -m compactrl.tasksets.terminal_bench.base_images build debian:bookworm-slim >"$CACHE/base-images.log" 2>&1; then
  log "base-image root ready ($(($(date +%s) - start)) s)"
else
  log "could not build the base-image root (see $CACHE/base-images.log): those tests will skip"
fi
run_tests "$@"
