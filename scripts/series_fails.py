#!/usr/bin/env python3
"""The tests each patch adds (in upstream's layout), run on the series WITHOUT that patch.

For patch k, the tests it adds run on the composed prefix 1..k-1 (the pristine base for k = 1), with
the test files of the full series and the trace/memory tool thunder/examine/full_size_copies.py that
they import (so that a test fails at what it checks, not at an import). Prints one line per test with
its outcome there and a summary; `make stock-fails` runs it after the root tests' check.

A test that passes without its patch is listed: it checks behaviour the patch keeps (errors like
eager's, the functional lowering under grad), not the fix.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import patchset  # noqa: E402

# Patch number -> (test file, -k expression) selecting the tests it adds (-k, because @instantiate names
# the generated tests after the executor and device).
TESTS_ADDED_BY_PATCH = {
    1: [("thunder/tests/test_update_aliases.py", "test_inputs_sharing_storage_any_shape_and_offset")],
    2: [
        (
            "thunder/tests/test_update_aliases.py",
            "test_return_after_write_into_view or test_read_of_in_place_result_after_write_to_its_base",
        )
    ],
    3: [("thunder/tests/test_update_aliases.py", "test_read_of_base_after_write_through_view_of_in_place_result")],
    4: [
        (
            "thunder/tests/test_inplace_copy.py",
            "test_dataflow_fusion_schedules_reads_before_the_in_place_write "
            "or test_return_is_scheduled_after_writes_that_nothing_reads",
        )
    ],
    5: [("thunder/tests/test_grad.py", "test_index_put_gradient_of_values")],
    6: [("thunder/tests/test_inplace_copy.py", "test_copy_broadcasts_its_source_like_torch")],
    7: [("thunder/tests/test_inplace_indexed_writes.py", "")],
    8: [("thunder/tests/test_dynamo_inplace_indexed_writes.py", "")],
    9: [("thunder/tests/test_grouped_query_attention.py", "")],
    10: [("thunder/tests/test_dynamo.py", "symint_input or symbolic_int_inputs")],
    11: [("thunder/tests/test_dynamo.py", "new_tensor_factories or sym_max_sym_min")],
    12: [("thunder/tests/test_dynamo.py", "histc")],
    13: [("thunder/tests/test_dynamo.py", "fake_backed_custom_op")],
    14: [("thunder/tests/test_torch_compile_executor.py", "symbolic_int_input_math")],
}
TOOL = "thunder/examine/full_size_copies.py"


def run(patch: int, selections: list[tuple[str, str]], full: Path, out_dir: Path) -> list[tuple[str, str, str]]:
    prefix = patchset.compose(patchset.BUILD / f"series-fails-{patch - 1:02d}", upto=patch - 1)
    # The test files as the full series has them, and the tool they import.
    for rel in {path for path, _ in selections} | {TOOL}:
        shutil.copy2(full / rel, prefix / rel)
    results = []
    for n, (path, expression) in enumerate(selections):
        xml = out_dir / f"patch-{patch}-{n}.xml"
        subprocess.run(
            [str(ROOT / ".venv/bin/python"), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "ignore",
             f"--junitxml={xml}", path, *(["-k", expression] if expression else [])],
            cwd=prefix, env={**os.environ, "PYTHONPATH": str(prefix)}, capture_output=True, text=True,
        )
        results += _outcomes(xml)
    return results


def _outcomes(xml: Path) -> list[tuple[str, str, str]]:
    results = []
    for case in ET.parse(xml).getroot().iter("testcase"):
        failure = case.find("failure")
        error = case.find("error")
        if failure is not None:
            message = (failure.get("message") or "").splitlines()[0][:110] if failure.get("message") else ""
            kind = "assert" if message.startswith(("AssertionError", "Failed")) or "assert" in message else "error"
            results.append((case.get("name"), kind, message))
        elif error is not None:
            results.append((case.get("name"), "setup-error", (error.get("message") or "")[:110]))
        elif case.find("skipped") is not None:
            results.append((case.get("name"), "skipped", ""))
        else:
            results.append((case.get("name"), "PASSES", ""))
    return results


def main(argv: list[str]) -> int:
    only = {int(a) for a in argv}  # patch numbers to check (default: all)
    full = patchset.compose()
    out_dir = patchset.BUILD / "series-fails"
    out_dir.mkdir(parents=True, exist_ok=True)
    totals = {"assert": 0, "error": 0, "PASSES": 0, "skipped": 0, "setup-error": 0}
    passing = []
    for patch, selections in TESTS_ADDED_BY_PATCH.items():
        if only and patch not in only:
            continue
        results = run(patch, selections, full, out_dir)
        for name, kind, message in results:
            totals[kind] += 1
            print(f"patch {patch}  {kind:11s} {name}  {message}")
            if kind == "PASSES":
                passing.append(f"{patch}:{name}")
    n = sum(totals.values())
    print(
        f"series-fails: {totals['assert'] + totals['error']} of {n} tests the series adds fail without their patch "
        f"({totals['assert']} at an assertion, {totals['error']} with the old code's exception); "
        f"{totals['PASSES']} pass there (behaviour the patch keeps), {totals['skipped']} skipped, "
        f"{totals['setup-error']} setup errors"
    )
    return 1 if totals["setup-error"] or totals["skipped"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
