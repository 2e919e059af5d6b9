#!/usr/bin/env python3
"""`make check-series`: the series is bisectable on 0.2.6 and applies, imports and passes on upstream main.

(a) For each prefix 1..N of patches/series on the 0.2.6 base: compose patches 1..k (with the files they
    add) into build/check-series/0.2.6-kk, import thunder and the modules the prefix adds or edits, and run
    the tests that exist at that prefix: upstream's fast suites from the composed tree
    (thunder/tests/test_update_aliases.py, test_inplace_copy.py) plus every thunder/tests/ test file the
    patches 1..k add.
(b) Upstream main (scripts/base-main.json) at the end of each PR of the stack (patches/prs) but the last:
    compose, import, the same suites as a prefix, so each PR applies and passes on main on top of the PRs
    before it. (c) The whole series on main: compose into build/check-series/main, import, the same
    upstream suites and the repository's tests/ (-m "not slow"), with PYTHONPATH on that tree and
    STOCK_BASE=main (so scripts/python-stock is pristine main).

One line per prefix/base, then one summary line; exits non-zero on any failure. Composed trees are reused
while their inputs are unchanged (patchset's stamps); logs go to build/check-series/logs/. Prefixes (and the
PRs' ends) are checked `--jobs` at a time (default: the machine's cores, at most 4): each is a pytest child
process spending most of its time in single-threaded tracing, so 2 cores check two at once.

    scripts/check_series.py [--only 0.2.6|main] [--upto N] [--from N] [--jobs J] [-- PYTEST_ARGS for tests/ on main]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import patchset  # noqa: E402
import series_tests  # noqa: E402

ROOT = patchset.ROOT
PY = ROOT / ".venv" / "bin" / "python"
OUT = patchset.BUILD / "check-series"
LOGS = OUT / "logs"
UPSTREAM_FAST = ["thunder/tests/test_update_aliases.py", "thunder/tests/test_inplace_copy.py"]
TIMEOUT_S = 1500


def _env(tree: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "STOCK_BASE")}
    return {**env, "PYTHONPATH": str(tree), "PYTHONWARNINGS": "ignore", **extra}


def _counts(output: str) -> dict[str, int]:
    """pytest's last summary line -> {'passed': 73, 'failed': 1, ...}."""
    lines = [ln for ln in output.splitlines() if re.search(r"\b(passed|failed|errors?|no tests ran)\b.* in [\d.]+s", ln)]
    if not lines:
        return {}
    found = re.findall(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed|deselected)", lines[-1])
    counts: dict[str, int] = {}
    for n, what in found:
        counts["error" if what.startswith("error") else what] = int(n)
    return counts


def _describe(counts: dict[str, int]) -> str:
    order = ["passed", "failed", "error", "skipped", "xfailed", "xpassed", "deselected"]
    return ", ".join(f"{counts[k]} {k}" for k in order if counts.get(k)) or "no tests ran"


def run_pytest(label: str, args: list[str], *, cwd: Path, env: dict[str, str]) -> tuple[bool, dict[str, int], Path]:
    LOGS.mkdir(parents=True, exist_ok=True)
    log = LOGS / f"{label}.log"
    cmd = [str(PY), "-m", "pytest", "-q", "-p", "no:cacheprovider", *args]
    try:
        proc = subprocess.run(cmd, cwd=cwd, env=env, text=True, capture_output=True, timeout=TIMEOUT_S)
        output, rc = proc.stdout + proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as e:
        output, rc = f"{e.stdout or ''}{e.stderr or ''}\ncheck-series: timed out after {TIMEOUT_S} s", 124
    log.write_text(f"$ (cd {cwd} && {' '.join(cmd)})\n{output}")
    counts = _counts(output)
    ok = rc == 0 and counts.get("passed", 0) > 0 and not counts.get("failed") and not counts.get("error")
    return ok, counts, log


def _failing_imports(tree: Path, modules: list[str]) -> dict[str, str]:
    """{module: last line of its error} for the modules that do not import from `tree` (thunder first)."""
    code = (
        "import importlib, sys, thunder\n"
        f"assert thunder.__file__.startswith({str(tree)!r}), f'imports {{thunder.__file__}}'\n"
        "failed = {}\n"
        f"for m in {modules!r}:\n"
        "    try: importlib.import_module(m)\n"
        "    except Exception as e: failed[m] = f'{type(e).__name__}: {e}'.splitlines()[0]\n"
        "print(repr(failed))\n"
    )
    proc = subprocess.run([str(PY), "-c", code], cwd=tree, env=_env(tree), text=True, capture_output=True)
    if proc.returncode != 0:
        return {"thunder": (proc.stderr.strip().splitlines() or ["import failed"])[-1]}
    return eval(proc.stdout.strip().splitlines()[-1])  # a dict literal printed by the child


def check_import(tree: Path, modules: list[str], base: patchset.Base) -> tuple[str | None, list[str]]:
    """(error, skipped): error is None if `import thunder` and the touched modules import from `tree`.
    A module that fails on the pristine base as well (an executor whose library is absent here, such as
    nvfuserex_impl or cudnn_sdpa) is not the series' failure: it is skipped and named."""
    failed = _failing_imports(tree, modules)
    if "thunder" in failed:
        return failed["thunder"], []
    if not failed:
        return None, []
    pristine = base.ensure_pristine()
    on_base = _failing_imports(pristine, [m for m in failed if (pristine / (m.replace(".", "/") + ".py")).exists()
                                          or (pristine / m.replace(".", "/") / "__init__.py").exists()])
    ours = {m: e for m, e in failed.items() if m not in on_base}
    if ours:
        m, e = next(iter(ours.items()))
        return f"{m}: {e}", []
    return None, sorted(failed)


def _touched_modules(selected) -> list[str]:
    """Modules the patches add or edit (not tests): the import check imports each one."""
    paths: set[str] = set()
    for _, patch, added in selected:
        paths.update(added)
        paths.update(re.findall(r"(?m)^diff --git a/\S+ b/(\S+)$", patch.read_text()))
    mods = []
    for p in sorted(paths):
        if p.endswith(".py") and not p.startswith("thunder/tests/") and not p.endswith("/__main__.py"):
            mod = p[:-3].replace("/", ".")
            mods.append(mod[: -len(".__init__")] if mod.endswith(".__init__") else mod)
    return mods


def check_tree(label: str, tree: Path, selected, base: patchset.Base) -> tuple[bool, str, dict[str, int]]:
    """Import check + upstream fast suites + the tests of the selected patches (patches/tests), inside `tree`."""
    err, skipped = check_import(tree, _touched_modules(selected), base)
    if err is not None:
        return False, f"import FAILED: {err}", {}
    fast = [s for s in UPSTREAM_FAST if (tree / s).exists()]
    selections = series_tests.selections_upto(len(selected))
    files = [f for f in series_tests.files(selections) if (tree / f).exists()]
    args = ["-p", "series_tests", "--series-tests", f"--series-upto={len(selected)}"]
    args += [f"--series-whole={f}" for f in fast] + list(dict.fromkeys(fast + files))
    env = _env(tree)
    env["PYTHONPATH"] = f"{env['PYTHONPATH']}:{ROOT / 'scripts'}"
    ok, counts, log = run_pytest(label, args, cwd=tree, env=env)
    added = len({s.patch for s in selections})
    what = "upstream fast suites" + (f" + the tests of {added} patches" if added else "")
    unimportable = f" (not importable on the base here either: {', '.join(skipped)})" if skipped else ""
    text = f"import ok{unimportable}; {what}: {_describe(counts)}"
    if not ok:
        text += f"  FAILED (log: {patchset.relative_to_root(log)})"
    return ok, text, counts


def _in_order(items: list, check, jobs: int) -> int:
    """Run `check(item) -> (ok, line)` over the items, `jobs` at a time (each one is mostly a pytest child
    process), print each line in the items' order as soon as it and those before it are done; -> how many ok."""
    good = 0
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        for ok, line in pool.map(check, items):
            good += ok
            print(line, flush=True)
    return good


def _check_prefix(base: patchset.Base, n: int, k: int) -> tuple[bool, str]:
    t0 = time.monotonic()
    selected = patchset.resolved_series(base, k)
    name = selected[-1][0].name
    label = f"{base.key}-{k:02d}"
    try:
        tree = patchset.compose(OUT / label, base=base, upto=k, quiet=True)
    except patchset.PatchSetError as e:
        return False, f"{base.key} prefix {k}/{n} {name}: compose FAILED: {str(e).splitlines()[0]}"
    ok, text, _ = check_tree(label, tree, selected, base)
    return ok, f"{base.key} prefix {k}/{n} {name[:40]}: {text} [{time.monotonic() - t0:.0f} s]"


def check_prefixes(upto: int | None, first: int = 1, jobs: int = 1) -> tuple[int, int]:
    base = patchset.get_base(patchset.DEFAULT_BASE)
    base.ensure_pristine()  # once, before the prefixes compose from it side by side
    n = len(patchset.read_series())
    last = n if upto is None else min(upto, n)
    good = _in_order(list(range(first, last + 1)), lambda k: _check_prefix(base, n, k), jobs)
    return good, last - first + 1


def _check_pr_end(base: patchset.Base, name: str, upto: int) -> tuple[bool, str]:
    t0 = time.monotonic()
    label = f"main-pr-{name}"
    try:
        selected = patchset.resolved_series(base, upto)
        tree = patchset.compose(OUT / label, base=base, upto=upto, quiet=True)
    except patchset.PatchSetError as e:
        return False, f"main PR {name} (patches 1..{upto}): compose FAILED: {str(e).splitlines()[0]}"
    ok, text, _ = check_tree(label, tree, selected, base)
    return ok, f"main PR {name} (patches 1..{upto}): {text} [{time.monotonic() - t0:.0f} s]"


def check_pr_prefixes(jobs: int = 1) -> tuple[int, int]:
    """Upstream main at the last patch of each PR but the last (patches/prs): compose, import and the tests
    that exist there, as for a 0.2.6 prefix. The last PR is the whole series, which check_main checks."""
    base = patchset.get_base("main")
    base.ensure_pristine()
    prs = series_tests.pull_requests()[:-1]
    good = _in_order(prs, lambda pr: _check_pr_end(base, *pr), jobs)
    return good, len(prs)


def check_main(pytest_args: list[str]) -> tuple[bool, str]:
    t0 = time.monotonic()
    base = patchset.get_base("main")
    try:
        selected = patchset.resolved_series(base)
        tree = patchset.compose(OUT / "main", base=base, quiet=True)
    except patchset.PatchSetError as e:
        print(f"main: compose FAILED: {e}", flush=True)
        return False, "main: compose FAILED"
    variants = [p.name[:4] for _, p, _ in selected if p.parent != patchset.PATCHES]
    ok, text, counts = check_tree("main-upstream", tree, selected, base)
    if stale := patchset.stale_variant_messages(selected):
        ok, text = False, text + f"; FAILED: variants with another message than the 0.2.6 patch: {stale}"
    passed = counts.get("passed", 0)
    print(f"main (series of {len(selected)}, variants {', '.join(variants) or 'none'}): {text} [{time.monotonic() - t0:.0f} s]", flush=True)
    if not text.startswith("import ok"):
        return False, "main: composed, import FAILED"
    t0 = time.monotonic()
    repo_ok, repo_counts, log = run_pytest(
        "main-repo-tests", ["tests", "-m", "not slow", *pytest_args], cwd=ROOT, env=_env(tree, STOCK_BASE="main")
    )
    fail = "" if repo_ok else f"  FAILED (log: {patchset.relative_to_root(log)})"
    print(f"main: repository tests/ (-m 'not slow'{' ' + ' '.join(pytest_args) if pytest_args else ''}): "
          f"{_describe(repo_counts)}{fail} [{time.monotonic() - t0:.0f} s]", flush=True)
    passed += repo_counts.get("passed", 0)
    failed = sum(c.get(k, 0) for c in (counts, repo_counts) for k in ("failed", "error"))
    summary = f"main: composed, {passed} passed" + (f", {failed} failed" if failed else "") + ("" if ok and repo_ok else " (FAILED)")
    return ok and repo_ok, summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=[patchset.DEFAULT_BASE, "main"], help="check one base only")
    parser.add_argument("--upto", type=int, help="0.2.6: check prefixes 1..N only")
    parser.add_argument("--from", dest="first", type=int, default=1, help="0.2.6: start at prefix N")
    parser.add_argument("--no-pr-prefixes", action="store_true", help="main: only the whole series, not each PR's end")
    parser.add_argument(
        "--jobs", type=int, default=min(os.cpu_count() or 1, 4), help="prefixes checked side by side (default: the cores, at most 4)"
    )
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments for the tests/ run on main")
    args = parser.parse_args(argv)
    t0 = time.monotonic()
    parts, ok = [], True
    try:
        if args.only in (None, patchset.DEFAULT_BASE):
            good, total = check_prefixes(args.upto, args.first, args.jobs)
            ok &= good == total
            parts.append(f"{patchset.DEFAULT_BASE} prefixes {good}/{total} ok")
        if args.only in (None, "main") and not args.no_pr_prefixes:
            good, total = check_pr_prefixes(args.jobs)
            ok &= good == total
            parts.append(f"main at the PRs' ends {good}/{total} ok")
        if args.only in (None, "main"):
            main_ok, summary = check_main(args.pytest_args)
            ok &= main_ok
            parts.append(summary)
    except patchset.PatchSetError as e:
        print(f"check-series: error: {e}", file=sys.stderr)
        return 1
    print(f"check-series: {'; '.join(parts)} [{time.monotonic() - t0:.0f} s]" + ("" if ok else " -- FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
