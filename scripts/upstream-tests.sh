#!/usr/bin/env bash
# Thunder's own tests shipped in the base wheel, run on the patched build and on the pristine base,
# side by side. Slow (about 10 minutes per side on 2 cores); not part of `make test`.
#   scripts/upstream-tests.sh [fast]   fast = update_aliases + inplace_copy suites only
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
suites=(thunder/tests/test_update_aliases.py thunder/tests/test_inplace_copy.py)
ops_filter="index_copy or index_put or index_add or index_fill or scatter or masked_scatter or setitem or getitem or histc or new_"
if [ "${1:-}" != fast ]; then
  suites+=(thunder/tests/test_dynamo.py)
fi
# A private composed copy, so that re-composing build/patched meanwhile does not disturb the run.
.venv/bin/python scripts/patchset.py compose --out build/upstream-tests-patched --force >/dev/null
for side in patched stock; do
  if [ $side = patched ]; then py=.venv/bin/python; tree=build/upstream-tests-patched; else py=scripts/python-stock; tree=build/base; fi
  echo "== $side ($tree)"
  (cd "$tree" && PYTHONPATH="$root/$tree" "$root/$py" -m pytest -q -p no:cacheprovider "${suites[@]}" 2>&1 | tail -1)
  if [ "${1:-}" != fast ]; then
    (cd "$tree" && PYTHONPATH="$root/$tree" "$root/$py" -m pytest -q -p no:cacheprovider thunder/tests/test_ops.py -k "$ops_filter" 2>&1 | tail -1)
  fi
done
