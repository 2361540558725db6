#!/usr/bin/env bash
# The test suite in three lanes, two at a time (README command 2 and .ci/run call this after scripts/setup.sh):
#   parallel     tests that launch real ranks (horovodrun/mpirun, Gloo and MPI)   -m parallel
#   interpreter  Triton kernels under the CPU interpreter (tests/conftest.py's INTERPRETER_MODULES)
#   unit         everything else
# The interpreter lane runs beside the parallel lane, and the unit lane follows the parallel lane (the two sides
# take about as long). The parallel lane spreads its tests over two pytest-xdist workers
# (HVD_NGP_PARALLEL_WORKERS), since its ranks idle in start-up, collectives and waits for signals (tests of
# simulated hosts share one worker: tests/conftest.py's xdist groups). Each lane keeps pytest's --durations table
# in its log; the logs are printed when their lane ends, then one summary line per lane and
# a total line. Exit status: 0 when every lane passed (a lane that selects nothing counts as passed).
# The unit lane includes tests/test_packaging.py's wheel test (marker "packaging": builds the wheel, installs it into a
# fresh venv that reuses this one's packages, trains 20 steps from outside the checkout; about 30 s on 2 cores).
#
#   bash scripts/test.sh                  # all lanes
#   bash scripts/test.sh unit parallel    # some lanes
#   HVD_NGP_TEST_ARGS="-x -k march" bash scripts/test.sh interpreter   # more pytest options for every lane
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
PY="${HVD_NGP_PYTHON:-.venv/bin/python}"
LOGS="${HVD_NGP_TEST_LOGS:-runs/test-lanes}"
mkdir -p "$LOGS"
read -r -a EXTRA <<<"${HVD_NGP_TEST_ARGS:-}"

declare -A SELECT=(
  [parallel]="parallel"
  [interpreter]="interpreter and not parallel"
  [unit]="not parallel and not interpreter"
)
lanes=("$@")
((${#lanes[@]})) || lanes=(parallel interpreter unit)
for lane in "${lanes[@]}"; do
  [[ -n "${SELECT[$lane]:-}" ]] || { echo "scripts/test.sh: unknown lane '$lane' (parallel, interpreter, unit)" >&2; exit 2; }
done

WORKERS="${HVD_NGP_PARALLEL_WORKERS:-2}"
run_lane() {  # run_lane NAME: one pytest process; its log, exit status and wall seconds under $LOGS
  local name=$1 start rc spread=()
  [[ $name == parallel && $WORKERS -gt 1 ]] && spread=(-n "$WORKERS" --dist loadgroup)
  start=$(date +%s)
  "$PY" -m pytest -q -p no:cacheprovider --durations=15 -m "${SELECT[$name]}" "${spread[@]}" "${EXTRA[@]}" \
    >"$LOGS/$name.log" 2>&1
  rc=$?
  ((rc == 5)) && rc=0  # nothing selected
  echo "$rc $(($(date +%s) - start))" >"$LOGS/$name.status"
  { echo "=================================== lane $name ==================================="; cat "$LOGS/$name.log"; }
}

t0=$(date +%s)
rm -f "$LOGS"/*.status
has() { [[ " ${lanes[*]} " == *" $1 "* ]]; }
pids=()
if has parallel; then { run_lane parallel; if has unit; then run_lane unit; fi; } & pids+=($!); fi
for lane in "${lanes[@]}"; do
  [[ $lane == parallel ]] && continue
  [[ $lane == unit ]] && has parallel && continue  # it follows the parallel lane
  run_lane "$lane"
done
wait "${pids[@]}" 2>/dev/null

status=0 passed=0 failed=0 skipped=0
count() {  # count WORD LINE -> the number before WORD in pytest's closing line, or 0
  local n
  n=$(grep -oE "[0-9]+ $1" <<<"$2" | head -1 | cut -d' ' -f1)
  echo "${n:-0}"
}
echo
for lane in "${lanes[@]}"; do
  read -r rc secs <"$LOGS/$lane.status" || { rc=1; secs=0; }
  last=$(grep -E "(passed|failed|error|skipped|deselected|no tests ran)" "$LOGS/$lane.log" | tail -1)
  printf 'lane %-12s %5d s  exit %d  %s\n' "$lane" "$secs" "$rc" "$last"
  ((rc == 0)) || status=1
  passed=$((passed + $(count passed "$last")))
  failed=$((failed + $(count failed "$last") + $(count error "$last")))
  skipped=$((skipped + $(count skipped "$last")))
done
echo "lanes took $(($(date +%s) - t0)) s in all"
echo "total: $passed passed, $failed failed, $skipped skipped"
exit $status
