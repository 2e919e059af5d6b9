#!/usr/bin/env python3
"""Compose, edit and export the patch set against a pinned lightning-thunder base.

The repository never holds Thunder's own code. Everything here is derived from these inputs:

* a base: ``0.2.6`` (default), the wheel pinned in ``scripts/base.json`` (PyPI, sha256-checked), or
  ``main``, upstream main as the tarball pinned in ``scripts/base-main.json`` (``../shared/upstream``
  beside the clone, sha256-checked; upstream main is not on PyPI and CI cannot reach GitHub);
* ``patches/series``: the patches in order, each with the files under ``thunder/`` it adds;
* ``patches/NNNN-*.patch``: git-format patches that *edit* files of the base; where a patch needs
  other context on main, ``patches/main/`` holds a variant with the same file name (same message);
* ``thunder/``: the files the set *adds*, at their upstream paths, in their final form. A file is added
  by the patch that claims it; a later patch may edit it (its diff section on that file), so an added
  file grows patch by patch. Compose starts an added file from its first form, which is the final form
  with the later patches' sections on it reversed, and checks that the whole series gives the final form.

``patches/series``, one entry per patch::

    # comments and blank lines are ignored
    0001-dynamo-route-in-place-indexed-writes-on-graph-inputs.patch  thunder/dynamo/indexed_writes.py
        thunder/examine/full_size_copies.py        <- an indented line continues the entry above
    0002-prims-add-in-place-indexed-write-prims-with-torch-ex.patch
    0008-dynamo-inplace_indexed_writes-inplace-default-keeps-.patch  thunder/benchmarks/

A claim is a file, a directory (``dir/``: every added file under it) or a glob (``*``, ``?``, ``[``).
Every file under ``thunder/`` is claimed by exactly one patch, and every claim matches a file.

Subcommands (all idempotent; ``make`` wraps them; ``--base {0.2.6,main}`` on each):

``compose``        unpack the base into ``build/base[-main]`` (pristine) and build ``build/patched[-main]``
                   = base + the series, each patch with its added files. ``--upto N``: only patches 1..N
                   (and their added files). Fails naming the first patch that does not apply.
``edit``           make ``build/edit[-main]``, a git repository with one commit for the base and one per
                   patch (its edits and its added files), to edit the series with ordinary git.
                   ``edit --continue`` resumes after a patch that did not apply was resolved with git am.
``export``         write ``build/edit``'s commits back to ``patches/`` + ``series`` and their added files
                   to ``thunder/``. ``--base main``: writes to ``patches/main/`` only the patches whose
                   change differs from the 0.2.6 one; the series' order, messages and claims are shared.
``upstream-diff``  write ``build/upstream[-main].diff`` (the composed tree against the base as one diff)
                   and check that it applies with ``git apply --check`` to a pristine copy of the base.
``series``         print the series as resolved for a base: ``N patch-path added-file...`` per line.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

# The tools live in patchtools/ (common, bases, series, compose, editing); other scripts and the tests
# import them through this module.
from patchtools.common import (  # noqa: E402, F401
    BASE_PIN,
    BUILD,
    MAIN_PIN,
    PATCHES,
    ROOT,
    SERIES,
    PatchSetError,
    git_apply,
    relative_to_root,
    run_git,
)
from patchtools.bases import BASES, DEFAULT_BASE, Base, base_requirements, get_base  # noqa: E402, F401
from patchtools.series import (  # noqa: E402, F401
    Entry,
    assign_added_files,
    filter_patch,
    format_series,
    main_variants,
    overlay_files,
    patch_header,
    read_series,
    resolved_series,
    stale_variant_messages,
)
from patchtools.compose import added_file_edits, compose, first_forms, upstream_diff  # noqa: E402, F401
from patchtools.editing import drop_adding_sections, edit, export  # noqa: E402, F401


def print_series(base: Base | str, upto: int | None) -> None:
    for i, (entry, patch, added) in enumerate(resolved_series(base, upto), 1):
        print(" ".join([str(i), relative_to_root(patch), *added]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)

    def with_base(p):
        p.add_argument(
            "--base",
            choices=sorted(BASES),
            default=DEFAULT_BASE,
            help=f"which base to work on (default {DEFAULT_BASE})",
        )
        return p

    p = with_base(sub.add_parser("compose"))
    p.add_argument("--out", type=Path)
    p.add_argument("--upto", type=int, help="only patches 1..N of the series (and the files they add)")
    p.add_argument("--force", action="store_true")
    p = with_base(sub.add_parser("edit"))
    p.add_argument(
        "--continue",
        dest="resume",
        action="store_true",
        help="go on after a patch that stopped git am was resolved and committed",
    )
    with_base(sub.add_parser("export"))
    with_base(sub.add_parser("upstream-diff"))
    p = with_base(sub.add_parser("series"))
    p.add_argument("--upto", type=int)
    args = parser.parse_args(argv)
    try:
        if args.cmd == "compose":
            compose(args.out, base=args.base, upto=args.upto, force=args.force)
        elif args.cmd == "edit":
            edit(args.base, resume=args.resume)
        elif args.cmd == "export":
            export(args.base)
        elif args.cmd == "upstream-diff":
            upstream_diff(args.base)
        elif args.cmd == "series":
            print_series(args.base, args.upto)
    except PatchSetError as e:
        print(f"patchset: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
