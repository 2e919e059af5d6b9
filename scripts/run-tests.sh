#!/usr/bin/env bash
# The test suite on one composed base: the tests the series adds in upstream's layout (run inside the
# composed tree, as upstream runs thunder/tests), then this repository's tests/ (composed build, stock A/B,
# HF client, fuzzer, benchmark smoke).
#   scripts/run-tests.sh 0.2.6|main [PYTEST_ARGS...]      e.g. scripts/run-tests.sh main -q -m "not slow"
# On main, PYTHONPATH puts build/patched-main in front of the .venv's .pth (which names build/patched) and
# STOCK_BASE=main makes scripts/python-stock pristine main.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
# VENV: another venv of this checkout (make test-torch VERSION=...: .venv-torch-VERSION).
py="$root/${VENV:-.venv}/bin/python"
base=${1:?usage: scripts/run-tests.sh 0.2.6|main [PYTEST_ARGS...]}
shift
case "$base" in
  0.2.6) tree=build/patched ;;
  main) tree=build/patched-main; export STOCK_BASE=main ;;
  *) echo "run-tests: unknown base $base" >&2; exit 2 ;;
esac
"$py" scripts/patchset.py upstream-diff --base "$base" || exit 1
export PYTHONPATH="$root/$tree"
"$py" -W ignore -c "
import thunder
assert '/$tree/' in thunder.__file__, f'imports the wrong Thunder: {thunder.__file__}'
print(f'run-tests: thunder {thunder.__version__} from {thunder.__file__}')" || exit 1
# Upstream-layout tests of the series (patches/tests lists them: scripts/series_tests.py), and upstream's fast
# suites of the files the series edits most, whole.
mapfile -t series_files < <("$py" scripts/series_tests.py files) || exit 1
fast_suites=(thunder/tests/test_update_aliases.py thunder/tests/test_inplace_copy.py)
status=0
(cd "$tree" && PYTHONPATH="$root/$tree:$root/scripts" "$py" -m pytest -p no:cacheprovider -W ignore \
  -p series_tests --series-tests "${fast_suites[@]/#/--series-whole=}" "${series_files[@]}" "$@") || status=1
"$py" -m pytest tests "$@" || status=1
exit $status
