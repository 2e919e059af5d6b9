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
base=${1:?usage: scripts/run-tests.sh 0.2.6|main [PYTEST_ARGS...]}
shift
case "$base" in
  0.2.6) tree=build/patched ;;
  main) tree=build/patched-main; export STOCK_BASE=main ;;
  *) echo "run-tests: unknown base $base" >&2; exit 2 ;;
esac
.venv/bin/python scripts/patchset.py upstream-diff --base "$base" || exit 1
export PYTHONPATH="$root/$tree"
.venv/bin/python -W ignore -c "
import thunder
assert '/$tree/' in thunder.__file__, f'imports the wrong Thunder: {thunder.__file__}'
print(f'run-tests: thunder {thunder.__version__} from {thunder.__file__}')" || exit 1
# Upstream-layout tests of the series: the files it adds, and the tests its patches add to upstream files.
upstream_tests=(
  thunder/tests/test_inplace_indexed_writes.py
  thunder/tests/test_dynamo_inplace_indexed_writes.py
  thunder/tests/test_grouped_query_attention.py
  thunder/tests/test_update_aliases.py
  thunder/tests/test_inplace_copy.py
  "thunder/tests/test_grad.py::test_index_put_gradient_of_values"
  "thunder/tests/test_dynamo.py::test_symint_input_used_as_a_value_is_traced_once"
  "thunder/tests/test_dynamo.py::test_symint_input_used_as_a_shape_retraces_and_stays_correct"
  "thunder/tests/test_dynamo.py::test_jit_symbolic_int_inputs_option"
  "thunder/tests/test_dynamo.py::test_new_tensor_factories_are_thunder_symbols"
  "thunder/tests/test_dynamo.py::test_sym_max_sym_min_stay_in_thunder"
  "thunder/tests/test_dynamo.py::test_histc_matches_torch_bitwise"
  "thunder/tests/test_dynamo.py::test_histc_stays_in_thunder_under_thunderfx"
  "thunder/tests/test_dynamo.py::test_fake_backed_custom_op_stays_in_thunder"
  "thunder/tests/test_torch_compile_executor.py::test_symbolic_int_input_math_stays_out_of_the_compiled_region"
)
status=0
(cd "$tree" && "$root/.venv/bin/python" -m pytest -p no:cacheprovider -W ignore "${upstream_tests[@]}" "$@") || status=1
.venv/bin/python -m pytest tests "$@" || status=1
exit $status
