#!/usr/bin/env bash
# Run the README's test command N times in a row on a fresh clone, and log every run.
#
#   bash scripts/repeat_tests.sh N [--quick] [--nice LEVEL] [--ref REV] [--keep] [--in CLONE]
#
# Clones this repository (the commit REV, default HEAD: what is committed, not the working tree)
# into a new temporary folder, then runs `bash scripts/test.sh` there N times, one after another
# (the first run also sets the clone up, as a new user's would). For each run it records the start
# time (UTC), duration, CPU seconds, exit status, pytest's summary lines and the machine's load: the 1-minute
# load average at the start and the end, and its minimum and maximum sampled every 10 s during
# the run. It appends
#   benchmarks/results/test_runs.log   one line per run (machine-readable key=value), plus a header per batch
#   benchmarks/results/test_runs.md    one table per batch (commit, mode, machine, then one row per run)
# of THIS checkout, and keeps each run's full output in the clone's folder, printed at the end.
# --quick runs `bash scripts/test.sh --quick` instead; --nice runs the test command at that niceness
# (default 0); --keep keeps the clone (otherwise removed when every run passed); --in CLONE runs in
# a clone kept from an earlier batch instead (checked out at REV, its set-up venv reused; the log
# says so). Exit status: the number of failed runs (0: all green).
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
usage() { sed -n '2,4p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
[[ $# -ge 1 && "$1" =~ ^[1-9][0-9]*$ ]] || usage
N=$1; shift
MODE=full NICE=0 REF=HEAD KEEP=0 REUSE=
while [[ $# -gt 0 ]]; do
  case "$1" in
    --quick) MODE=quick ;;
    --nice) NICE=${2:?--nice needs a level}; shift ;;
    --ref) REF=${2:?--ref needs a revision}; shift ;;
    --keep) KEEP=1 ;;
    --in) REUSE=${2:?--in needs a clone}; shift ;;
    *) usage ;;
  esac
  shift
done
COMMIT=$(git rev-parse --verify "$REF^{commit}") || { echo "repeat_tests: --ref $REF is not a commit" >&2; exit 2; }
RESULTS="$REPO/benchmarks/results"
LOG="$RESULTS/test_runs.log" MD="$RESULTS/test_runs.md"
mkdir -p "$RESULTS"

if [[ -n "$REUSE" ]]; then
  CLONE=$(cd "$REUSE" && pwd) WORK=$(dirname "$CLONE") FRESH="an earlier clone, set up"
  git -C "$CLONE" fetch -q origin && git -C "$CLONE" checkout -q --detach "$COMMIT" || exit 1
  KEEP=1
  [[ -z $(git -C "$CLONE" status --porcelain) ]] || { echo "repeat_tests: $CLONE has local changes" >&2; exit 2; }
else
  WORK=$(mktemp -d "${TMPDIR:-/tmp}/compactrl-repeat.XXXXXX") || exit 1
  CLONE="$WORK/compactrl" FRESH="a fresh clone"
  git clone -q --no-hardlinks "$REPO" "$CLONE" && git -C "$CLONE" checkout -q --detach "$COMMIT" || exit 1
fi
CMD=(bash scripts/test.sh)
[[ $MODE == quick ]] && CMD+=(--quick)
# the CPU, and the widest vector extension it has: float kernels (torch's, vLLM's FP8 KV cache) differ by it
CPU_MODEL=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)
if grep -qw avx512f /proc/cpuinfo; then ISA=AVX-512; elif grep -qw avx2 /proc/cpuinfo; then ISA="AVX2, no AVX-512"; else ISA="no AVX2"; fi
MACHINE="$(nproc) CPUs (${CPU_MODEL:-unknown CPU}, $ISA), $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo), $(uname -sr)"
BATCH="$(date -u +%Y-%m-%dT%H:%MZ) commit ${COMMIT:0:7}"
STAMP=$(date -u +%H%M%S)

load1() { cut -d' ' -f1 /proc/loadavg; }

{
  echo "# batch $BATCH: $N x \`${CMD[*]}\` (nice $NICE) in $FRESH ($CLONE); machine: $MACHINE"
} >> "$LOG"
{
  echo
  echo "### $BATCH: $N x \`${CMD[*]}\`, $FRESH, nice $NICE"
  echo
  echo "Machine: $MACHINE. Load: the 1-minute load average (start / end, min-max sampled every 10 s)."
  echo
  echo "| run | started (UTC) | result | duration | CPU (user + sys) | pytest summary | load start / end | load min-max |"
  echo "|---|---|---|---|---|---|---|---|"
} >> "$MD"

failed=0
for ((i = 1; i <= N; i++)); do
  out="$WORK/run-$STAMP-$i.log"
  samples="$WORK/load-$STAMP-$i.txt"
  started=$(date -u +%H:%M:%S) t0=$(date +%s) l0=$(load1)
  # a fresh run marker per run (not inherited from a caller's test run)
  cpu="$WORK/cpu-$STAMP-$i.txt"
  # CPU seconds (user + system, the command and all its children): what the run costs whatever the load
  (cd "$CLONE" && exec env -u COMPACTRL_TEST_RUN /usr/bin/time -f "%U %S" -o "$cpu" nice -n "$NICE" "${CMD[@]}") \
    > "$out" 2>&1 &
  pid=$!
  load1 > "$samples"
  while kill -0 "$pid" 2>/dev/null; do
    for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
    load1 >> "$samples"
  done
  wait "$pid"
  rc=$?
  secs=$(($(date +%s) - t0)) l1=$(load1)
  range=$(sort -g "$samples" | sed -n '1p;$p' | paste -sd- -)
  # test.sh runs pytest twice (the suite, then the docker tests): both summaries, in order
  summary=$(grep -E '^=+ .*(passed|failed|error|skipped|deselected).* in [0-9.]+s' "$out" \
            | sed -E 's/^=+ //; s/ =+$//' | paste -sd';' - | sed 's/;/; /g')
  result=$([[ $rc == 0 ]] && echo pass || echo "FAIL (exit $rc)")
  [[ $rc == 0 ]] || failed=$((failed + 1))
  duration=$(printf '%dm%02ds' $((secs / 60)) $((secs % 60)))
  cpu_s=$(awk 'NF == 2 && $1 ~ /^[0-9.]+$/ {printf "%.0f", $1 + $2}' "$cpu" 2>/dev/null)
  echo "run=$i started=$started rc=$rc seconds=$secs cpu_seconds=${cpu_s:-?} load_start=$l0 load_end=$l1 load_range=$range" \
       "summary=\"$summary\" output=$out" >> "$LOG"
  echo "| $i | $started | $result | $duration | ${cpu_s:-?} s | ${summary:-none} | $l0 / $l1 | $range |" >> "$MD"
  echo "repeat_tests: run $i/$N: $result in $duration (load $l0 -> $l1, $range): ${summary:-no pytest summary}" >&2
done
echo "| | | **$((N - failed)) of $N green** | | | | | |" >> "$MD"
if [[ $failed == 0 && $KEEP == 0 ]]; then
  rm -rf "$WORK"
  echo "repeat_tests: $N of $N green; clone removed" >&2
else
  echo "repeat_tests: $((N - failed)) of $N green; clone and outputs kept in $WORK" >&2
fi
exit "$failed"
