"""The tests each patch of the series adds (``patches/tests``), for run-tests.sh, check_series.py and
series_fails.py, and a pytest plugin that selects them.

``patches/tests``: ``PATCH FILE [NAME ...]`` per line (an indented line adds names to the line above);
PATCH is the patch's file name without its ``NNNN-`` prefix and ``.patch``, so the map survives a
renumbering. A test is selected when its name starts with one of the NAMEs; no NAMEs: the whole file.

As a plugin (``-p series_tests``, with scripts/ on the path): ``--series-tests`` keeps only the tests of
``patches/tests`` among those collected; ``--series-upto N`` only those of patches 1..N; ``--series-patch
SLUG`` only those of that patch; ``--series-whole
FILE`` (repeatable) keeps a file whole besides (upstream's fast suites).

CLI: ``series_tests.py files [--upto N]`` prints the test files (one per line) to give pytest.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TESTS_FILE = ROOT / "patches" / "tests"
SERIES_FILE = ROOT / "patches" / "series"


@dataclass
class Selection:
    patch: str  # the patch's name without NNNN- and .patch
    path: str  # test file, relative to the Thunder tree's root
    names: list[str] = field(default_factory=list)  # test name prefixes; empty: the whole file

    def selects(self, path: str, name: str) -> bool:
        return path == self.path and (not self.names or name.startswith(tuple(self.names)))


def slug(patch_file: str) -> str:
    """``0005-foo-bar.patch`` -> ``foo-bar``."""
    return re.sub(r"^\d{4}-", "", patch_file.removesuffix(".patch"))


def read(path: Path = TESTS_FILE) -> list[Selection]:
    selections: list[Selection] = []
    for lineno, raw in enumerate(path.read_text().splitlines(), 1):
        if raw.lstrip().startswith("#") or not raw.strip():
            continue
        tokens = raw.split()
        if raw[0].isspace():
            if not selections:
                raise ValueError(f"{path}:{lineno}: an indented line continues a line, but none precedes it")
            selections[-1].names += tokens
        else:
            if len(tokens) < 2:
                raise ValueError(f"{path}:{lineno}: expected 'PATCH FILE [NAME ...]'")
            selections.append(Selection(tokens[0], tokens[1], tokens[2:]))
    return selections


def series_order(series: Path = SERIES_FILE) -> list[str]:
    """The patches' slugs in series order."""
    names = []
    for raw in series.read_text().splitlines():
        line = raw.split("#", 1)[0]
        if line.strip() and not raw[0].isspace():
            names.append(slug(line.split()[0]))
    return names


def selections_upto(n: int | None = None, *, path: Path = TESTS_FILE, series: Path = SERIES_FILE) -> list[Selection]:
    """The selections of patches 1..n (all patches when n is None), checked against the series."""
    order = series_order(series)
    selections = read(path)
    unknown = sorted({s.patch for s in selections} - set(order))
    if unknown:
        raise ValueError(f"{path} names patches that are not in the series: {unknown}")
    keep = set(order if n is None else order[:n])
    return [s for s in selections if s.patch in keep]


PRS_FILE = ROOT / "patches" / "prs"


def pull_requests(path: Path = PRS_FILE, series: Path = SERIES_FILE) -> list[tuple[str, int]]:
    """``patches/prs``: [(PR name, number of patches up to and including its last)] in merge order; every
    patch belongs to one PR (the last PR ends with the series)."""
    order = series_order(series)
    prs = []
    for lineno, raw in enumerate(path.read_text().splitlines(), 1):
        if raw.lstrip().startswith("#") or not raw.strip():
            continue
        name, last = raw.split()
        if last not in order:
            raise ValueError(f"{path}:{lineno}: {last!r} is not a patch of the series")
        upto = order.index(last) + 1
        if prs and upto <= prs[-1][1]:
            raise ValueError(f"{path}:{lineno}: PR {name} ends before the PR above it")
        prs.append((name, upto))
    if not prs or prs[-1][1] != len(order):
        raise ValueError(f"{path}: the last PR must end with the series' last patch")
    return prs


def files(selections: list[Selection]) -> list[str]:
    return list(dict.fromkeys(s.path for s in selections))


# pytest plugin


def pytest_addoption(parser):
    group = parser.getgroup("series tests")
    group.addoption("--series-tests", action="store_true", help="select the tests patches/tests lists")
    group.addoption("--series-upto", type=int, default=None, help="only those of patches 1..N")
    group.addoption("--series-patch", action="append", default=[], help="only the tests of this patch (its slug)")
    group.addoption(
        "--series-whole", action="append", default=[], help="a test file to keep whole (upstream's own suites)"
    )


import pytest  # noqa: E402


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    if not config.getoption("--series-tests"):
        return
    selections = selections_upto(config.getoption("--series-upto"))
    if only := config.getoption("--series-patch"):
        selections = [s for s in selections if s.patch in only]
    selections += [Selection("", path) for path in config.getoption("--series-whole")]
    rootdir = Path(config.invocation_params.dir)  # run-tests.sh runs pytest at the Thunder tree's root

    def relative(item) -> str:
        path = Path(str(item.path)).resolve()
        try:
            return path.relative_to(rootdir.resolve()).as_posix()
        except ValueError:
            return path.as_posix()

    located = [(relative(item), item) for item in items]
    kept = [item for rel, item in located if any(s.selects(rel, item.name) for s in selections)]
    deselected = [item for rel, item in located if not any(s.selects(rel, item.name) for s in selections)]
    # A name that selects nothing in a collected file is a stale entry (a renamed or removed test).
    collected = {rel for rel, _ in located}
    stale = [
        f"{s.patch}: {s.path}::{name}"
        for s in selections
        if s.path in collected
        for name in s.names
        if not any(rel == s.path and item.name.startswith(name) for rel, item in located)
    ]
    if stale:
        raise pytest.UsageError(f"patches/tests names tests that do not exist: {stale}")
    if deselected:
        config.hook.pytest_deselected(items=deselected)
    items[:] = kept


def main(argv: list[str]) -> int:
    if not argv or argv[0] != "files":
        print(__doc__, file=sys.stderr)
        return 2
    upto = int(argv[argv.index("--upto") + 1]) if "--upto" in argv else None
    print("\n".join(files(selections_upto(upto))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
