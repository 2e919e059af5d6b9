"""Compose a base + the series (+ added files, grown patch by patch) into a tree; the upstream diff."""

from __future__ import annotations

import hashlib
import re
import shutil
import sys
import tempfile
from pathlib import Path

from patchtools.common import BUILD, PATCHES, PatchSetError, ROOT, run_git, relative_to_root, git_apply
from patchtools.bases import Base, DEFAULT_BASE, get_base
from patchtools.series import has_diff, overlay_files, resolved_series, stale_variant_messages


def patch_sections(text: str) -> list[tuple[str, str]]:
    """(path, section) for each `diff --git` section of a git-format patch."""
    out = []
    for s in re.split(r"(?m)^(?=diff --git )", text)[1:]:
        m = re.match(r"diff --git a/(\S+) b/(\S+)", s)
        if m is not None:
            out.append((m.group(2), s))
    return out


def adds_file(section: str) -> bool:
    header = section.split("\n@@", 1)[0]
    return "\nnew file mode " in header


def added_file_edits(selected, added_paths: set[str]) -> dict[str, list[tuple[int, str]]]:
    """Added file -> [(patch number, section)] of the later patches that edit it, in series order."""
    edits: dict[str, list[tuple[int, str]]] = {}
    for i, (_, patch, _) in enumerate(selected, 1):
        for path, section in patch_sections(patch.read_text()):
            if path in added_paths and not adds_file(section):
                edits.setdefault(path, []).append((i, section))
    return edits


def first_forms(base: "Base", added_paths: list[str]) -> dict[str, bytes]:
    """Added file -> its content when its patch adds it: the final form (thunder/) with the sections of the
    later patches that edit it reversed, last patch first."""
    edits = added_file_edits(resolved_series(base), set(added_paths))
    forms = {rel: (ROOT / rel).read_bytes() for rel in added_paths}
    if not edits:
        return forms
    BUILD.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(dir=BUILD) as tmp:
        tree = Path(tmp) / "t"
        for rel, sections in edits.items():
            (tree / rel).parent.mkdir(parents=True, exist_ok=True)
            (tree / rel).write_bytes(forms[rel])
            for i, section in reversed(sections):
                diff = Path(tmp) / "section.diff"
                diff.write_text(section)
                proc = git_apply(diff, tree, reverse=True)
                if proc.returncode != 0:
                    raise PatchSetError(
                        f"patch {i}'s edit of {rel} does not reverse from thunder/{rel[len('thunder/') :]} "
                        f"(after reversing the later edits): the added file and the series disagree\n{proc.stderr}"
                    )
            forms[rel] = (tree / rel).read_bytes()
    return forms


# ---------------------------------------------------------------------------------------------------
# compose


def _fingerprint(base: Base, selected, forms: dict[str, bytes]) -> str:
    digest = hashlib.sha256(f"{base.key}\0{base.pin_sha256}".encode())
    for entry, patch, added in selected:
        digest.update(f"\0{entry.name}\0{relative_to_root(patch)}\0".encode())
        digest.update(patch.read_bytes())
        for rel in added:
            digest.update(f"\0{rel}\0".encode())
            digest.update(forms[rel])
    return digest.hexdigest()


def compose(
    out: Path | None = None,
    *,
    base: Base | str = DEFAULT_BASE,
    upto: int | None = None,
    force: bool = False,
    quiet: bool = False,
) -> Path:
    """build/base[-main] = pristine base; build/patched[-main] (or `out`) = base + series (1..upto)."""
    base = get_base(base)
    if out is None:
        out = base.patched_dir if upto is None else BUILD / f"prefix{base.suffix or '-' + base.key}-{upto:02d}"
    out = Path(out).resolve()
    selected = resolved_series(base, upto)
    all_added = overlay_files()
    forms = first_forms(base, all_added)
    fingerprint = _fingerprint(base, selected, forms)
    base_dir = base.ensure_pristine()
    stamp = out / ".patchset-stamp"
    if not force and stamp.exists() and stamp.read_text() == fingerprint:
        return out
    collisions = [p for p in all_added if (base_dir / p).exists()]
    if collisions:
        raise PatchSetError(f"thunder/ must only add files, but these exist in the {base.key} base: {collisions}")
    BUILD.mkdir(exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix="compose-", dir=BUILD))
    try:
        shutil.copytree(base_dir / "thunder", staging / "thunder")
        for i, (entry, patch, added) in enumerate(selected, 1):
            for rel in added:
                (staging / rel).parent.mkdir(parents=True, exist_ok=True)
                (staging / rel).write_bytes(forms[rel])
            if has_diff(patch):
                proc = git_apply(patch, staging)
                if proc.returncode != 0:
                    where = f"patches/main/{patch.name}" if patch.parent != PATCHES else patch.name
                    raise PatchSetError(
                        f"patch {i} ({where}) does not apply on the {base.key} base after patches 1..{i - 1}:\n{proc.stderr}"
                    )
        if upto is None:
            differ = [rel for rel in all_added if (staging / rel).read_bytes() != (ROOT / rel).read_bytes()]
            if differ:
                raise PatchSetError(f"the series' edits of added files do not end in their form in thunder/: {differ}")
        (staging / ".patchset-stamp").write_text(fingerprint)
        if out.exists():
            shutil.rmtree(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        staging.rename(out)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    if stale := stale_variant_messages(selected):
        print(
            f"patchset: warning: patches/main/ variants whose message differs from the {DEFAULT_BASE} patch's: "
            f"{stale}; refresh them (make edit BASE=main; make export BASE=main)",
            file=sys.stderr,
        )
    if not quiet:
        n_added = sum(len(a) for _, _, a in selected)
        n_var = sum(p.parent != PATCHES for _, p, _ in selected)
        variants = f", {n_var} of them main variants" if base.variants is not None else ""
        upto_s = f" (patches 1..{upto})" if upto is not None else ""
        print(
            f"patchset: composed {relative_to_root(out)}: {base.key} base + {len(selected)} patches{variants}{upto_s} + {n_added} added files"
        )
    return out


# ---------------------------------------------------------------------------------------------------
# upstream-diff


def upstream_diff(base: Base | str = DEFAULT_BASE) -> Path:
    """One diff (series + added files) against the pristine base, checked with `git apply --check`."""
    base = get_base(base)
    patched = compose(base=base)
    with tempfile.TemporaryDirectory(dir=BUILD) as tmp:
        repo = Path(tmp) / "repo"
        shutil.copytree(base.ensure_pristine() / "thunder", repo / "thunder")
        run_git(repo, "init", "-q")
        run_git(repo, "add", "-A")
        run_git(repo, "commit", "-q", "-m", "base")
        shutil.rmtree(repo / "thunder")
        shutil.copytree(patched / "thunder", repo / "thunder", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        run_git(repo, "add", "-A")
        diff = run_git(repo, "diff", "--cached", "--binary", "HEAD", capture=True)
        run_git(repo, "reset", "-q", "--hard", "HEAD")
        diff_path = base.diff_path
        diff_path.write_text(diff)
        # The check runs on a fresh pristine tree, not on the repository that produced the diff.
        check_dir = Path(tmp) / "check"
        base.unpack(check_dir)
        proc = git_apply(diff_path, check_dir, check=True)
        if proc.returncode != 0:
            raise PatchSetError(
                f"{relative_to_root(diff_path)} does not apply to the pristine {base.key} base:\n{proc.stderr}"
            )
    files = diff.count("\ndiff --git ") + diff.startswith("diff --git ")
    print(
        f"patchset: wrote {relative_to_root(diff_path)} ({files} files); `git apply --check` on pristine {base.key} base: ok"
    )
    return diff_path
