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

import series_tests  # noqa: E402

TOOL = "thunder/examine/full_size_copies.py"


def run(patch: int, slug: str, paths: list[str], full: Path, out_dir: Path) -> list[tuple[str, str, str]]:
    prefix = patchset.compose(patchset.BUILD / f"series-fails-{patch - 1:02d}", upto=patch - 1)
    # The test files as the full series has them, and the tool they import.
    for rel in {*paths, TOOL}:
        shutil.copy2(full / rel, prefix / rel)
    xml = out_dir / f"patch-{patch}.xml"
    subprocess.run(
        [str(ROOT / ".venv/bin/python"), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "ignore",
         f"--junitxml={xml}", "-p", "series_tests", "--series-tests", f"--series-patch={slug}", *paths],
        cwd=prefix, env={**os.environ, "PYTHONPATH": f"{prefix}:{ROOT / 'scripts'}"}, capture_output=True, text=True,
    )
    return _outcomes(xml)


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
    order = series_tests.series_order()
    selections = series_tests.selections_upto()
    for patch, slug in enumerate(order, 1):
        paths = series_tests.files([s for s in selections if s.patch == slug])
        if not paths or (only and patch not in only):
            continue
        results = run(patch, slug, paths, full, out_dir)
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
