#!/usr/bin/env bash
# `make test` (CI: .ci/run): lint, then the suite on the 0.2.6 build and on the series composed on upstream
# main, the two bases side by side. Each base's suite is one Python process that spends most of its time in
# Thunder's (single-threaded) tracing, so on a 2-core machine the pair takes the time of the longer one
# (measured 2026-12-07: 0.2.6 12.0 min and main 12.5 min side by side, against 22 min one after the other).
# Each base's output goes to build/test-logs/BASE.log and is printed whole when both are done.
#   scripts/test.sh [PYTEST_ARGS...]          (default: -q -m "not slow")
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
args=("$@")
[ ${#args[@]} -gt 0 ] || args=(-q -m "not slow")
logs=build/test-logs
mkdir -p "$logs"

status=0
bash scripts/lint.sh || status=1

declare -A pid
for base in 0.2.6 main; do
  extra=()
  # The benchmark smoke test runs the benchmark of thunder/ (the same files on both bases) end to end; `make
  # bench` runs on the 0.2.6 build, so that is where its check runs (it is 2 of the main run's 10 minutes).
  [ "$base" = main ] && extra=(--deselect tests/test_benchmark_quick.py)
  bash scripts/run-tests.sh "$base" "${args[@]}" "${extra[@]}" >"$logs/$base.log" 2>&1 &
  pid[$base]=$!
done
echo "test: the suite on 0.2.6 and on upstream main, side by side (logs: $logs/0.2.6.log, $logs/main.log)"

declare -A rc
for base in 0.2.6 main; do
  wait "${pid[$base]}"
  rc[$base]=$?
done
for base in 0.2.6 main; do
  echo "== on $base"
  cat "$logs/$base.log"
  [ "${rc[$base]}" -eq 0 ] || status=1
done
echo "test: 0.2.6 $([ "${rc[0.2.6]}" -eq 0 ] && echo passed || echo FAILED)," \
  "main $([ "${rc[main]}" -eq 0 ] && echo passed || echo FAILED)"
exit $status
