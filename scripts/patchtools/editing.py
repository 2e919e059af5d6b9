"""`edit` / `export`: the series as a git repository (one commit per patch) and back."""

from __future__ import annotations

import json
import re
import shutil
import sys
import tempfile
from pathlib import Path

from patchtools.common import (
    BUILD,
    FORMAT_PATCH,
    OVERLAY,
    PATCHES,
    PatchSetError,
    ROOT,
    SERIES,
    run_git,
    relative_to_root,
    sha256_of,
)
from patchtools.bases import BASES, Base, DEFAULT_BASE, get_base
from patchtools.series import (
    Entry,
    claim_matches,
    slug_of,
    assign_added_files,
    format_series,
    has_diff,
    overlay_files,
    patch_header,
    read_series,
    resolved_series,
    series_header,
)
from patchtools.compose import adds_file, first_forms


# ---------------------------------------------------------------------------------------------------
# edit / export


def _state_path(repo: Path) -> Path:
    return repo / ".git" / "patchset-edit.json"


def _am_in_progress(repo: Path) -> bool:
    return (repo / ".git" / "rebase-apply").exists()


def _copy_added(repo: Path, added: list[str], forms: dict[str, bytes]) -> None:
    for rel in added:
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_bytes(forms[rel])


def edit(base: Base | str = DEFAULT_BASE, *, resume: bool = False) -> None:
    """build/edit[-main]: base commit (tag `base`), then one commit per patch, with the files it adds."""
    base = get_base(base)
    repo = base.edit_dir
    selected = resolved_series(base)
    forms = first_forms(base, overlay_files())
    state_file = _state_path(repo)
    if resume:
        if not state_file.exists():
            raise PatchSetError(f"nothing to continue in {relative_to_root(repo)}")
        if _am_in_progress(repo):
            raise PatchSetError(
                f"git am is still in progress in {relative_to_root(repo)}: resolve, `git am --continue`, then continue"
            )
        state = json.loads(state_file.read_text())
        if [e.name for e, _, _ in selected] != state["series"]:
            raise PatchSetError("patches/series changed since `edit` started; start again (rm -rf the edit repository)")
        start = state["next"]
    else:
        if repo.exists():
            raise PatchSetError(
                f"{relative_to_root(repo)} exists; export or delete it first (rm -rf {relative_to_root(repo)})"
            )
        base.unpack(repo)
        run_git(repo, "init", "-q", "-b", "series")
        run_git(repo, "add", "-A")
        run_git(repo, "commit", "-q", "-m", f"base: {base.description}")
        run_git(repo, "tag", "base")
        # What thunder/ held when the repository was made: export refuses to overwrite later changes.
        state = {
            "base": base.key,
            "series": [e.name for e, _, _ in selected],
            "overlay": {rel: sha256_of(ROOT / rel) for rel in overlay_files()},
        }
        start = 0
    for i, (entry, patch, added) in enumerate(selected[start:], start):
        if has_diff(patch):
            try:
                run_git(repo, "am", "-q", "--keep-non-patch", str(patch))
            except PatchSetError as e:
                # Stage the patch's added files, so that `git am --continue` commits them with it.
                _copy_added(repo, added, forms)
                if added:
                    run_git(repo, "add", "--", *added)
                state_file.write_text(json.dumps({**state, "next": i + 1}))
                flag = f" --base {base.key}" if base.key != DEFAULT_BASE else ""
                raise PatchSetError(
                    f"patch {i + 1} ({relative_to_root(patch)}) does not apply in {relative_to_root(repo)}; git am stopped there.\n"
                    f"  Resolve it (e.g. `git apply --reject .git/rebase-apply/patch`, fix, `git add`), "
                    f"`git am --continue`,\n  then `scripts/patchset.py edit --continue{flag}` for the rest.\n{e}"
                ) from None
        else:
            run_git(repo, "am", "-q", "--keep-non-patch", "--empty=keep", str(patch))
        if added:
            _copy_added(repo, added, forms)
            run_git(repo, "add", "--", *added)
            run_git(repo, "commit", "-q", "--amend", "--no-edit")
    state_file.write_text(json.dumps({**state, "next": len(selected)}))
    print(
        f"patchset: {relative_to_root(repo)} ready ({len(selected)} patches on the {base.key} base); commit there, then export"
    )


def _commits(repo: Path) -> list[str]:
    return run_git(repo, "rev-list", "--reverse", "base..HEAD", capture=True).split()


def _export_checks(repo: Path) -> tuple[set[str], list[str], dict]:
    if not (repo / ".git").exists():
        raise PatchSetError(f"no {relative_to_root(repo)} repository; run edit first")
    if _am_in_progress(repo):
        raise PatchSetError(
            f"git am is in progress in {relative_to_root(repo)}; finish it (and `edit --continue`) first"
        )
    if run_git(repo, "status", "--porcelain", capture=True).strip():
        raise PatchSetError(f"{relative_to_root(repo)} has uncommitted changes; commit them first")
    state = json.loads(_state_path(repo).read_text()) if _state_path(repo).exists() else {}
    if state and state.get("next", 0) < len(state.get("series", [])):
        raise PatchSetError(f"{relative_to_root(repo)} holds only part of the series; `edit --continue` first")
    base_paths = set(run_git(repo, "ls-tree", "-r", "--name-only", "base", capture=True).split("\n")) - {""}
    head_paths = set(run_git(repo, "ls-tree", "-r", "--name-only", "HEAD", capture=True).split("\n")) - {""}
    outside = sorted(p for p in head_paths - base_paths if not p.startswith("thunder/"))
    if outside:
        raise PatchSetError(f"files outside thunder/ cannot be exported: {outside}")
    added_final = sorted(head_paths - base_paths)
    # Refuse to overwrite files changed in thunder/ after edit copied them (unless the commits agree).
    recorded = state.get("overlay", {})
    clobbered = []
    for rel in sorted(set(overlay_files()) | set(recorded)):
        ours, theirs = ROOT / rel, repo / rel
        now = sha256_of(ours) if ours.exists() else None
        if recorded.get(rel) != now:  # changed, added or deleted in thunder/ since edit
            same = theirs.exists() == ours.exists() and (not ours.exists() or theirs.read_bytes() == ours.read_bytes())
            if not same:
                clobbered.append(rel)
    if clobbered:
        raise PatchSetError(
            f"these files in thunder/ changed after edit made {relative_to_root(repo)}; copy them into it (and commit) first: {clobbered}"
        )
    return base_paths, added_final, state


def _added_by_commit(repo: Path, commits: list[str], added_final: list[str]) -> list[list[str]]:
    """For each commit, the files it adds (diff-filter=A) that are still there at HEAD; a file added twice
    belongs to the first commit that added it."""
    seen: set[str] = set()
    final = set(added_final)
    result = []
    for c in commits:
        names = run_git(
            repo, "diff-tree", "-r", "--no-commit-id", "--name-only", "--diff-filter=A", f"{c}^", c, capture=True
        ).split()
        mine = sorted(n for n in names if n in final and n not in seen)
        seen.update(mine)
        result.append(mine)
    return result


def _format_patches(repo: Path, base_paths: set[str]) -> list[tuple[str, str]]:
    """(file name, text) per commit base..HEAD, keeping the diffs of files that exist in the base and the
    edits of added files (a file's adding section is dropped: thunder/ holds the file)."""
    with tempfile.TemporaryDirectory(dir=BUILD) as tmp:
        out = run_git(repo, *FORMAT_PATCH, "-o", tmp, "base..HEAD", capture=True).split()
        if len(out) != len(_commits(repo)):
            raise PatchSetError(
                f"{relative_to_root(repo)}: empty or merge commits in base..HEAD cannot be exported; drop or squash them"
            )
        return [(Path(p).name, drop_adding_sections(Path(p).read_text())) for p in out]


def drop_adding_sections(text: str) -> str:
    parts = re.split(r"(?m)^(?=diff --git )", text)
    return parts[0] + "".join(s for s in parts[1:] if not adds_file(s))


def _reuse_claims(old_claims: list[str], added: list[str], added_final: list[str]) -> list[str] | None:
    """The entry's claims as written before, if they still claim exactly the files the commit adds."""
    if not old_claims:
        return None
    matched = {a for a in added_final if any(claim_matches(c, a) for c in old_claims)}
    if matched == set(added) and all(any(claim_matches(c, a) for a in added) for c in old_claims):
        return list(old_claims)
    return None


def _compress_claims(files: list[str], all_added: list[str], base_paths: set[str]) -> list[str]:
    """Claims for `files`: a directory that is new (not in the base) and whose added files all come from
    this patch is claimed as `dir/`; other files one by one."""
    mine = set(files)
    claims: list[str] = []
    covered: set[str] = set()
    for f in files:
        if f in covered:
            continue
        parts = f.split("/")
        for depth in range(2, len(parts)):  # never claim thunder/ itself
            d = "/".join(parts[:depth])
            in_base = any(p.startswith(d + "/") for p in base_paths)
            under = [a for a in all_added if a.startswith(d + "/")]
            if not in_base and set(under) <= mine:
                claims.append(d + "/")
                covered.update(under)
                break
        else:
            claims.append(f)
            covered.add(f)
    return claims


def export(base: Base | str = DEFAULT_BASE) -> None:
    base = get_base(base)
    if base.variants is not None:
        return export_variants(base)
    repo = base.edit_dir
    base_paths, added_final, _ = _export_checks(repo)
    commits = _commits(repo)
    added_per_commit = _added_by_commit(repo, commits, added_final)
    formatted = _format_patches(repo, base_paths)
    old_entries = read_series(check_files=False)
    old_by_name = {e.name: e for e in old_entries}
    old_by_slug = {e.slug: e for e in old_entries}
    header = series_header()
    entries = []
    for (name, _), added in zip(formatted, added_per_commit):
        old = old_by_name.get(name) or old_by_slug.get(slug_of(name))
        claims = _reuse_claims(old.claims if old else [], added, added_final)
        if claims is None:
            claims = _compress_claims(added, added_final, base_paths)
        entries.append(Entry(name, claims))
    # Write: patches, series, then the added files in their final form.
    old_patch_names = {p.name for p in PATCHES.glob("*.patch")}
    for old in PATCHES.glob("*.patch"):
        old.unlink()
    PATCHES.mkdir(exist_ok=True)
    for name, text in formatted:
        (PATCHES / name).write_text(text)
    SERIES.write_text(format_series(entries, header))
    if OVERLAY.exists():
        shutil.rmtree(OVERLAY)
    for rel in added_final:
        (ROOT / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(repo / rel, ROOT / rel)
    assign_added_files(read_series())  # the series just written claims every file once
    _record_overlay(repo)
    _rename_variants(entries, old_patch_names)
    n_empty = sum(not has_diff(PATCHES / e.name) for e in entries)
    empty = f" ({n_empty} of them only add files)" if n_empty else ""
    print(f"patchset: exported {len(entries)} patches{empty} and {len(added_final)} added files")


def _record_overlay(repo: Path) -> None:
    """thunder/ now holds what this export wrote: a later export from the same repository may overwrite it."""
    state_file = _state_path(repo)
    if state_file.exists():
        state = json.loads(state_file.read_text())
        state["overlay"] = {rel: sha256_of(ROOT / rel) for rel in overlay_files()}
        state_file.write_text(json.dumps(state))


def _rename_variants(entries: list[Entry], old_names: set[str]) -> None:
    """Keep patches/main/ in step with a renumbered series (same name but for the NNNN- number)."""
    vdir = BASES["main"].variants
    if not vdir.exists():
        return
    names = {e.name for e in entries}
    by_slug: dict[str, list[str]] = {}
    for e in entries:
        by_slug.setdefault(e.slug, []).append(e.name)
    for variant in sorted(vdir.glob("*.patch")):
        if variant.name in names:
            continue
        target = by_slug.get(slug_of(variant.name), [])
        if len(target) == 1 and not (vdir / target[0]).exists():
            variant.rename(vdir / target[0])
            print(f"patchset: renamed patches/main/{variant.name} -> {target[0]}")
        else:
            print(
                f"patchset: warning: patches/main/{variant.name} matches no patch of the series any more",
                file=sys.stderr,
            )


def export_variants(base: Base) -> None:
    """build/edit-main -> patches/main/: for each commit, a variant only if the 0.2.6 patch does not give
    the same change on main. The series (order, names, messages, claims) is the 0.2.6 side's."""
    repo = base.edit_dir
    base_paths, added_final, _ = _export_checks(repo)
    entries = read_series()
    claimed = assign_added_files(entries)
    commits = _commits(repo)
    if len(commits) != len(entries):
        raise PatchSetError(
            f"{relative_to_root(repo)} has {len(commits)} commits but patches/series {len(entries)} patches; "
            f"add, drop or reorder patches on the {DEFAULT_BASE} side (make edit), then re-make {relative_to_root(repo)}"
        )
    added_per_commit = _added_by_commit(repo, commits, added_final)
    formatted = _format_patches(repo, base_paths)
    vdir = base.variants
    written, dropped, shared_changed = [], [], []
    plans = []
    for i, (entry, commit, (_, text), added) in enumerate(zip(entries, commits, formatted, added_per_commit), 1):
        upstream = (PATCHES / entry.name).read_text()
        if patch_header(text) != patch_header(upstream):
            raise PatchSetError(
                f"commit {i} ({commit[:10]}): its message differs from patches/{entry.name}'s; messages are shared by "
                f"both bases, change them on the {DEFAULT_BASE} side (make edit)"
            )
        if added != claimed[entry.name]:
            raise PatchSetError(
                f"commit {i} adds {added}, but patches/series gives {entry.name} {claimed[entry.name]}; "
                f"which patch adds which file is decided on the {DEFAULT_BASE} side"
            )
        plans.append((entry, commit, text, _needs_variant(repo, commit, PATCHES / entry.name, base_paths)))
    for rel in added_final:
        if not (ROOT / rel).exists() or (repo / rel).read_bytes() != (ROOT / rel).read_bytes():
            shared_changed.append(rel)
    vdir.mkdir(parents=True, exist_ok=True)
    keep = set()
    for entry, commit, text, needed in plans:
        target = vdir / entry.name
        if needed:
            keep.add(target.name)
            if not target.exists() or target.read_text() != text:
                target.write_text(text)
            written.append(entry.name)
    for variant in vdir.glob("*.patch"):
        if variant.name not in keep:
            variant.unlink()
            dropped.append(variant.name)
    for rel in shared_changed:
        shutil.copy2(repo / rel, ROOT / rel)
    print(f"patchset: main variants: {len(written)} of {len(entries)} patches need one: {[n[:4] for n in written]}")
    if dropped:
        print(f"patchset: removed variants the {DEFAULT_BASE} patch now covers (or stale): {dropped}")
    if shared_changed:
        print(
            f"patchset: note: added files changed in {relative_to_root(repo)} were written to thunder/ (shared by both bases): {shared_changed}"
        )


def _needs_variant(repo: Path, commit: str, patch: Path, base_paths: set[str]) -> bool:
    """Whether the 0.2.6 patch, applied on the commit's parent, gives a different tree than the commit."""
    if not has_diff(patch):
        changed = run_git(
            repo, "diff-tree", "-r", "--no-commit-id", "--name-only", f"{commit}^", commit, capture=True
        ).split()
        return any(p in base_paths for p in changed)
    with tempfile.TemporaryDirectory(dir=BUILD) as tmp:
        env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        run_git(repo, "read-tree", f"{commit}^", env_extra=env)
        try:
            run_git(repo, "apply", "--cached", "--whitespace=nowarn", str(patch), env_extra=env)
        except PatchSetError:
            return True
        tree = run_git(repo, "write-tree", env_extra=env, capture=True).strip()
    differ = run_git(repo, "diff-tree", "-r", "--name-only", tree, commit, capture=True).split()
    return any(p in base_paths for p in differ)
