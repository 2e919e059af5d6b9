"""The series tooling (scripts/patchset.py): the series format, the added-file claims, and the
edit/export round trip on both bases (a copy of the repository's patches and thunder/ comes back
byte for byte, main variants included). No Thunder import: this checks the repository, not a build."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from _support import REPO

sys.path.insert(0, str(REPO / "scripts"))
import patchset  # noqa: E402


def _entries(tmp_path: Path, text: str):
    series = tmp_path / "series"
    series.write_text(text)
    return patchset.read_series(series, check_files=False)


def test_series_format(tmp_path):
    entries = _entries(
        tmp_path,
        "# header\n\n0001-a.patch  thunder/x.py   # trailing comment\n    thunder/y/\n0002-b.patch\n"
        "0003-c.patch thunder/z*.py thunder/w.py\n",
    )
    assert [(e.name, e.claims) for e in entries] == [
        ("0001-a.patch", ["thunder/x.py", "thunder/y/"]),
        ("0002-b.patch", []),
        ("0003-c.patch", ["thunder/z*.py", "thunder/w.py"]),
    ]
    again = _entries(tmp_path, patchset.format_series(entries, ["# header"]))
    assert [(e.name, e.claims) for e in again] == [(e.name, e.claims) for e in entries]
    with pytest.raises(patchset.PatchSetError, match="under thunder/"):
        _entries(tmp_path, "0001-a.patch tests/x.py\n")
    with pytest.raises(patchset.PatchSetError, match="twice"):
        _entries(tmp_path, "0001-a.patch\n0001-a.patch\n")


def test_claims_each_file_once():
    E = patchset.Entry
    files = ["thunder/a.py", "thunder/pkg/__init__.py", "thunder/pkg/m.py", "thunder/zz_1.py"]
    got = patchset.assign_added_files([E("1", ["thunder/a.py", "thunder/zz_*.py"]), E("2", ["thunder/pkg/"])], files)
    assert got == {"1": ["thunder/a.py", "thunder/zz_1.py"], "2": ["thunder/pkg/__init__.py", "thunder/pkg/m.py"]}
    # A directory claimed without its trailing slash, a glob over a directory.
    assert patchset.assign_added_files([E("1", ["thunder/pkg", "thunder/[az]*"])], files)["1"] == sorted(files)
    with pytest.raises(patchset.PatchSetError, match="no patch claims.*thunder/pkg/m.py"):
        patchset.assign_added_files([E("1", ["thunder/a.py", "thunder/zz_1.py", "thunder/pkg/__init__.py"])], files)
    with pytest.raises(patchset.PatchSetError, match="more than one patch"):
        patchset.assign_added_files([E("1", ["thunder/"]), E("2", ["thunder/a.py"])], files)
    with pytest.raises(patchset.PatchSetError, match="match no file.*thunder/gone.py"):
        patchset.assign_added_files([E("1", ["thunder/", "thunder/gone.py"])], files)


def test_repository_series_claims_every_added_file():
    entries = patchset.read_series()
    assigned = patchset.assign_added_files(entries)
    assert sorted(f for fs in assigned.values() for f in fs) == patchset.overlay_files()
    # Every variant for main belongs to an entry of the series.
    assert set(patchset.main_variants(entries)) <= {e.name for e in entries}


def test_pr_stack_covers_the_series_in_order():
    import series_tests

    prs = series_tests.pull_requests()
    ends = [upto for _, upto in prs]
    assert ends == sorted(set(ends)) and ends[-1] == len(patchset.read_series())
    # The maintainer's order: standalone fixes, aliasing, the core write, more writes, GQA, SymInts, enablers.
    names = [name.split("-", 1)[1] for name, _ in prs]
    assert names.index("standalone-fixes") < names.index("aliasing-and-order") < names.index("core-write")
    assert names.index("core-write") < names.index("more-indexed-writes") < names.index("grouped-query-attention")
    assert names.index("grouped-query-attention") < names.index("symbolic-ints") < names.index("decode-enablers")


def test_patch_subjects_and_authors():
    """What a maintainer asked of the stack: subjects of at most 72 characters, one author identity, and every
    patch's tests listed in patches/tests under a slug of the series (a renamed patch keeps its tests)."""
    import email
    import series_tests

    entries = patchset.read_series()
    authors = set()
    for e in entries:
        message = email.message_from_string((REPO / "patches" / e.name).read_text())
        subject = " ".join(message["Subject"].split()).removeprefix("[PATCH] ")
        assert len(subject) <= 72, (e.name, len(subject), subject)
        authors.add(" ".join(message["From"].split()))
    assert len(authors) == 1, authors
    slugs = {series_tests.slug(e.name) for e in entries}
    listed = {line.split()[0] for line in (REPO / "patches" / "tests").read_text().splitlines()
              if line.strip() and not line.startswith(("#", " "))}
    assert listed <= slugs, sorted(listed - slugs)


def test_filter_patch_keeps_only_base_files():
    text = (
        "From 0 Mon Sep 17 00:00:00 2001\nSubject: [PATCH] x\n\nwhy\n\n"
        "diff --git a/thunder/new.py b/thunder/new.py\nnew file mode 100644\n--- /dev/null\n+++ b/thunder/new.py\n@@ -0,0 +1 @@\n+x\n"
        "diff --git a/thunder/old.py b/thunder/old.py\n--- a/thunder/old.py\n+++ b/thunder/old.py\n@@ -1 +1 @@\n-a\n+b\n"
    )
    out = patchset.filter_patch(text, lambda p: p == "thunder/old.py")
    assert "thunder/new.py" not in out and "+b\n" in out and out.startswith("From 0")
    header_only = patchset.filter_patch(text, lambda p: False)
    assert "diff --git" not in header_only and patchset.patch_header(header_only) == patchset.patch_header(text)


def test_export_drops_the_adding_section_but_keeps_edits_of_added_files():
    text = (
        "From 0 Mon Sep 17 00:00:00 2001\nSubject: [PATCH] x\n\nwhy\n\n"
        "diff --git a/thunder/new.py b/thunder/new.py\nnew file mode 100644\n--- /dev/null\n+++ b/thunder/new.py\n@@ -0,0 +1 @@\n+x\n"
        "diff --git a/thunder/added.py b/thunder/added.py\n--- a/thunder/added.py\n+++ b/thunder/added.py\n@@ -1 +1 @@\n-a\n+b\n"
    )
    out = patchset.drop_adding_sections(text)
    assert "thunder/new.py" not in out and "b/thunder/added.py" in out and out.startswith("From 0")


def test_added_files_grow_patch_by_patch():
    """A later patch may edit a file an earlier one adds: the first form (what compose --upto puts in
    with the adding patch) is thunder/'s final form with the later edits reversed, and replaying those
    edits forward gives the final form back."""
    base = patchset.get_base(patchset.DEFAULT_BASE)
    added = patchset.overlay_files()
    edits = patchset.added_file_edits(patchset.resolved_series(base), set(added))
    # The series uses this: 0021 adds its cases to the tests 0012 adds.
    assert "thunder/tests/test_inplace_indexed_writes.py" in edits
    forms = patchset.first_forms(base, added)
    for rel, sections in edits.items():
        final = (REPO / rel).read_bytes()
        assert forms[rel] != final, rel
        tree = Path(tempfile.mkdtemp(dir=patchset.BUILD))
        try:
            (tree / rel).parent.mkdir(parents=True)
            (tree / rel).write_bytes(forms[rel])
            for i, section in sections:
                (tree / "edit.diff").write_text(section)
                proc = patchset.git_apply(tree / "edit.diff", tree)
                assert proc.returncode == 0, f"patch {i} on {rel}: {proc.stderr}"
            assert (tree / rel).read_bytes() == final, rel
        finally:
            shutil.rmtree(tree)


def _tree_digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for top in ("patches", "thunder")
        for p in sorted((root / top).rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


def _repository_copy(tmp_path) -> Path:
    """scripts/, patches/, thunder/ and the base wheel, copied: edit and export run there."""
    wheel = REPO / ".cache" / "base" / patchset.BASE_PIN["wheel"]
    if not wheel.exists():
        pytest.skip("the base wheel is not in .cache/ (run make setup)")
    repo = tmp_path / "repo"
    for top in ("scripts", "patches", "thunder"):
        shutil.copytree(REPO / top, repo / top, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    (repo / ".cache" / "base").mkdir(parents=True)
    shutil.copy2(wheel, repo / ".cache" / "base" / wheel.name)
    return repo


def test_second_export_from_one_edit_repository(tmp_path):
    """Export records what it writes to thunder/: a second commit and export from the same build/edit
    is not refused as a change made in thunder/ by hand (it was, until this was recorded)."""
    repo = _repository_copy(tmp_path)
    script = [sys.executable, str(repo / "scripts" / "patchset.py")]
    run = lambda *args: subprocess.run([*script, *args], cwd=repo, capture_output=True, text=True)  # noqa: E731
    proc = run("edit", "--base", patchset.DEFAULT_BASE)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    edit = repo / "build" / "edit"
    added = edit / "thunder" / "examine" / "full_size_copies.py"
    for line in ("# first change\n", "# second change\n"):
        added.write_text(added.read_text() + line)
        subprocess.run(["git", "commit", "-q", "-am", "a change"], cwd=edit, check=True)
        proc = run("export", "--base", patchset.DEFAULT_BASE)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert (repo / "thunder" / "examine" / "full_size_copies.py").read_text().endswith(line)
    # A change made in thunder/ by hand after that is still refused
    (repo / "thunder" / "examine" / "full_size_copies.py").write_text("# by hand\n")
    proc = run("export", "--base", patchset.DEFAULT_BASE)
    assert proc.returncode != 0 and "changed after edit" in proc.stdout + proc.stderr


def test_edit_export_round_trip(tmp_path):
    """make edit + make export with no change in between rewrites nothing, on 0.2.6 and on main."""
    repo = _repository_copy(tmp_path)
    tarball = (REPO / patchset.MAIN_PIN["tarball"]).resolve()
    if tarball.exists():
        (repo / patchset.MAIN_PIN["tarball"]).resolve().parent.mkdir(parents=True, exist_ok=True)
        os.symlink(tarball, (repo / patchset.MAIN_PIN["tarball"]).resolve())
    before = _tree_digest(repo)
    script = [sys.executable, str(repo / "scripts" / "patchset.py")]
    bases = [patchset.DEFAULT_BASE] + (["main"] if tarball.exists() else [])
    for base in bases:
        for cmd in ("edit", "export"):
            proc = subprocess.run([*script, cmd, "--base", base], cwd=repo, capture_output=True, text=True)
            assert proc.returncode == 0, proc.stdout + proc.stderr
        assert _tree_digest(repo) == before, f"round trip on {base} changed the repository"
    if not tarball.exists():
        pytest.skip(f"main part skipped: {patchset.MAIN_PIN['tarball']} is missing")
