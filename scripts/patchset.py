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
import fnmatch
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BASE_PIN = json.loads((ROOT / "scripts" / "base.json").read_text())
MAIN_PIN = json.loads((ROOT / "scripts" / "base-main.json").read_text())
CACHE = ROOT / ".cache" / "base"
BUILD = ROOT / "build"
OVERLAY = ROOT / "thunder"
PATCHES = ROOT / "patches"
SERIES = PATCHES / "series"

# Commit identity for the scratch repositories this script makes; it never touches the user's config.
GIT_ENV = {
    "GIT_AUTHOR_NAME": "patchset",
    "GIT_AUTHOR_EMAIL": "patchset@localhost",
    "GIT_COMMITTER_NAME": "patchset",
    "GIT_COMMITTER_EMAIL": "patchset@localhost",
    "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z",
    "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z",
}
FORMAT_PATCH = ["format-patch", "--no-signature", "--zero-commit", "--no-stat", "-N"]


class PatchSetError(RuntimeError):
    pass


def _git(cwd: Path, *args: str, capture: bool = False, env_extra: dict | None = None) -> str:
    env = {**os.environ, **GIT_ENV, **(env_extra or {})}
    proc = subprocess.run(["git", *args], cwd=cwd, env=env, text=True, capture_output=True)
    if proc.returncode != 0:
        raise PatchSetError(f"git {' '.join(args)} failed in {cwd}:\n{proc.stdout}{proc.stderr}")
    return proc.stdout if capture else ""


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _rel(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


# ---------------------------------------------------------------------------------------------------
# Bases


def base_wheel() -> Path:
    """The pinned base wheel, downloaded once into .cache/ and verified on every use."""
    wheel = CACHE / BASE_PIN["wheel"]
    if not wheel.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        spec = f"{BASE_PIN['distribution']}=={BASE_PIN['version']}"
        print(f"patchset: downloading {spec} from PyPI", file=sys.stderr)
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:", "-d", str(CACHE), spec]
        )
        if proc.returncode != 0 or not wheel.exists():
            # pip is not importable inside an isolated build environment (`pip install .`): ask PyPI directly.
            _download_from_pypi(wheel)
    actual = _sha256(wheel)
    if actual != BASE_PIN["sha256"]:
        raise PatchSetError(
            f"{wheel.name}: sha256 {actual} does not match the pin {BASE_PIN['sha256']} in scripts/base.json"
        )
    return wheel


def _download_from_pypi(dest: Path) -> None:
    import urllib.request

    meta_url = f"https://pypi.org/pypi/{BASE_PIN['distribution']}/{BASE_PIN['version']}/json"
    with urllib.request.urlopen(meta_url, timeout=120) as response:
        files = json.load(response)["urls"]
    (url,) = [f["url"] for f in files if f["filename"] == BASE_PIN["wheel"]]
    tmp = dest.with_suffix(".part")
    with urllib.request.urlopen(url, timeout=300) as response, tmp.open("wb") as out:
        shutil.copyfileobj(response, out)
    tmp.rename(dest)


def main_tarball() -> Path:
    """The pinned upstream-main tarball (beside the clone, never copied into it), verified on every use."""
    tarball = (ROOT / MAIN_PIN["tarball"]).resolve()
    if not tarball.exists():
        raise PatchSetError(
            f"the main base {MAIN_PIN['tarball']} (relative to the repository root) is missing; it lives in "
            f"shared/upstream beside the clone (see scripts/base-main.json)"
        )
    actual = _sha256(tarball)
    if actual != MAIN_PIN["sha256"]:
        raise PatchSetError(
            f"{tarball.name}: sha256 {actual} does not match the pin {MAIN_PIN['sha256']} in scripts/base-main.json"
        )
    return tarball


def base_requirements() -> list[str]:
    """The base wheel's own runtime requirements (Requires-Dist without extras)."""
    with zipfile.ZipFile(base_wheel()) as zf:
        (meta,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        lines = zf.read(meta).decode().splitlines()
    reqs = [ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("Requires-Dist:")]
    return [r for r in reqs if "extra ==" not in r]


@dataclass(frozen=True)
class Base:
    key: str  # "0.2.6" or "main"
    suffix: str  # "" or "-main": build/base{suffix}, build/patched{suffix}, build/edit{suffix}
    variants: Path | None  # where this base's patch variants live (None: the patches themselves)

    @property
    def pin_sha256(self) -> str:
        return BASE_PIN["sha256"] if self.key == BASE_PIN["version"] else MAIN_PIN["sha256"]

    @property
    def description(self) -> str:
        if self.variants is None:
            return f"lightning-thunder {BASE_PIN['version']} (pristine, from the PyPI wheel)"
        return f"lightning-thunder main {MAIN_PIN['commit'][:9]} (pristine, from {Path(MAIN_PIN['tarball']).name})"

    @property
    def base_dir(self) -> Path:
        return BUILD / f"base{self.suffix}"

    @property
    def patched_dir(self) -> Path:
        return BUILD / f"patched{self.suffix}"

    @property
    def edit_dir(self) -> Path:
        return BUILD / f"edit{self.suffix}"

    @property
    def diff_path(self) -> Path:
        return BUILD / f"upstream{self.suffix}.diff"

    def unpack(self, dest: Path) -> None:
        """Extract only the `thunder` package of the base (no dist-info, no packaging files) into dest."""
        if dest.exists():
            shutil.rmtree(dest)
        dest.mkdir(parents=True)
        if self.variants is None:
            with zipfile.ZipFile(base_wheel()) as zf:
                for name in zf.namelist():
                    if name.startswith("thunder/"):
                        zf.extract(name, dest)
        else:
            with tarfile.open(main_tarball()) as tf:
                members = [m for m in tf.getmembers() if m.name.startswith("thunder/") and (m.isfile() or m.isdir())]
                try:
                    tf.extractall(dest, members=members, filter="data")
                except TypeError:  # Python without extraction filters (< 3.11.4)
                    tf.extractall(dest, members=members)

    def ensure_pristine(self) -> Path:
        """build/base[-main]: the pristine base, re-unpacked when the pin changed."""
        stamp = self.base_dir / ".patchset-base"
        if not (stamp.exists() and stamp.read_text() == self.pin_sha256 and (self.base_dir / "thunder" / "__init__.py").exists()):
            self.unpack(self.base_dir)
            stamp.write_text(self.pin_sha256)
        return self.base_dir


BASES = {
    BASE_PIN["version"]: Base(BASE_PIN["version"], "", None),
    "main": Base("main", "-main", PATCHES / "main"),
}
DEFAULT_BASE = BASE_PIN["version"]


def get_base(key: str | Base) -> Base:
    if isinstance(key, Base):
        return key
    try:
        return BASES[key]
    except KeyError:
        raise PatchSetError(f"unknown base {key!r}; choose one of {sorted(BASES)}") from None


# ---------------------------------------------------------------------------------------------------
# The series: entries, claims, variants


@dataclass
class Entry:
    name: str
    claims: list[str] = field(default_factory=list)

    @property
    def slug(self) -> str:
        return _slug(self.name)


def _slug(name: str) -> str:
    """A patch's name without its NNNN- number, so that a reordered series still finds its variants."""
    return re.sub(r"^\d+-", "", name)


def read_series(path: Path = SERIES, *, check_files: bool = True) -> list[Entry]:
    """patches/series: `NAME [CLAIM ...]` per entry; an indented line adds claims to the entry above."""
    if not path.exists():
        return []
    entries: list[Entry] = []
    for lineno, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.split("#", 1)[0] if not raw.lstrip().startswith("#") else ""
        tokens = line.split()
        if not tokens:
            continue
        if raw[0].isspace():
            if not entries:
                raise PatchSetError(f"patches/series:{lineno}: an indented line continues an entry, but none precedes it")
            entries[-1].claims += tokens
        else:
            entries.append(Entry(tokens[0], tokens[1:]))
    for e in entries:
        bad = [c for c in e.claims if not c.startswith("thunder/") or ".." in Path(c).parts]
        if bad:
            raise PatchSetError(f"patches/series: {e.name}: claims must be paths under thunder/: {bad}")
    names = [e.name for e in entries]
    dups = sorted({n for n in names if names.count(n) > 1})
    if dups:
        raise PatchSetError(f"patches/series names a patch twice: {dups}")
    if check_files:
        missing = [n for n in names if not (PATCHES / n).exists()]
        if missing:
            raise PatchSetError(f"patches/series names missing files: {missing}")
    return entries


def format_series(entries: list[Entry], header: list[str]) -> str:
    width = max((len(e.name) for e in entries if e.claims), default=0)
    lines = list(header)
    for e in entries:
        if not e.claims:
            lines.append(e.name)
            continue
        lines.append(f"{e.name.ljust(width)}  {e.claims[0]}")
        lines += [f"    {c}" for c in e.claims[1:]]
    return "".join(f"{ln}\n" for ln in lines)


def series_header(path: Path = SERIES) -> list[str]:
    """The comment lines at the top of patches/series (kept when export rewrites it)."""
    header = []
    if path.exists():
        for raw in path.read_text().splitlines():
            if raw.startswith("#") or (not raw.strip() and header):
                header.append(raw)
            else:
                break
    while header and not header[-1].strip():
        header.pop()
    return header or [
        "# The patches in order. After each name: the files under thunder/ that the patch adds",
        "# (a file, a dir/ or a glob); an indented line continues the entry above. See CONTRIBUTING.md.",
    ]


def overlay_files(root: Path = ROOT) -> list[str]:
    """Files under root/thunder (for the repository: the files this set adds), as 'thunder/...' paths."""
    top = root / "thunder"
    if not top.exists():
        return []
    return sorted(
        str(p.relative_to(root))
        for p in top.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and not p.name.endswith(".pyc")
    )


def _claim_matches(claim: str, path: str) -> bool:
    if any(ch in claim for ch in "*?["):
        return fnmatch.fnmatchcase(path, claim) or fnmatch.fnmatchcase(path, claim.rstrip("/") + "/*")
    claim = claim.rstrip("/")
    return path == claim or path.startswith(claim + "/")


def assign_added_files(entries: list[Entry], files: list[str] | None = None) -> dict[str, list[str]]:
    """Patch name -> the added files it claims. Every file is claimed once; every claim matches a file."""
    files = overlay_files() if files is None else files
    owners: dict[str, list[str]] = {f: [] for f in files}
    assigned: dict[str, list[str]] = {e.name: [] for e in entries}
    unmatched = []
    for e in entries:
        for claim in e.claims:
            hits = [f for f in files if _claim_matches(claim, f)]
            if not hits:
                unmatched.append(f"{e.name}: {claim}")
            for f in hits:
                if e.name not in owners[f]:
                    owners[f].append(e.name)
                    assigned[e.name].append(f)
    problems = []
    if unmatched:
        problems.append("claims that match no file under thunder/: " + "; ".join(unmatched))
    unclaimed = [f for f, o in owners.items() if not o]
    if unclaimed:
        problems.append(f"files under thunder/ that no patch claims (add them to an entry in patches/series): {unclaimed}")
    twice = {f: o for f, o in owners.items() if len(o) > 1}
    if twice:
        problems.append(f"files claimed by more than one patch: {twice}")
    if problems:
        raise PatchSetError("patches/series: " + "\n  ".join(problems))
    return {name: sorted(fs) for name, fs in assigned.items()}


def main_variants(entries: list[Entry]) -> dict[str, Path]:
    """Entry name -> its variant in patches/main/: same file name, or the same name but for the NNNN- number
    (a reordered series). A variant that matches no entry is an error: it would silently stop applying."""
    vdir = BASES["main"].variants
    if not vdir.exists():
        return {}
    found: dict[str, Path] = {}
    by_slug: dict[str, list[Entry]] = {}
    for e in entries:
        by_slug.setdefault(e.slug, []).append(e)
    names = {e.name for e in entries}
    orphans = []
    for variant in sorted(vdir.glob("*.patch")):
        if variant.name in names:
            target = variant.name
        elif len(by_slug.get(_slug(variant.name), [])) == 1:
            target = by_slug[_slug(variant.name)][0].name
        else:
            orphans.append(variant.name)
            continue
        if target in found:
            raise PatchSetError(f"patches/main: two variants for {target}: {found[target].name}, {variant.name}")
        found[target] = variant
    if orphans:
        raise PatchSetError(
            f"patches/main/ variants that match no entry of patches/series: {orphans} (renamed on the 0.2.6 side? "
            f"rename them, or re-make them: make edit BASE=main ... make export BASE=main)"
        )
    return found


def resolved_series(base: Base | str, upto: int | None = None) -> list[tuple[Entry, Path, list[str]]]:
    """(entry, patch file for this base, added files) for patches 1..upto of the series."""
    base = get_base(base)
    entries = read_series()
    if upto is not None and not 0 <= upto <= len(entries):
        raise PatchSetError(f"--upto {upto}: the series has {len(entries)} patches")
    added = assign_added_files(entries)
    variants = main_variants(entries) if base.variants is not None else {}
    out = [(e, variants.get(e.name, PATCHES / e.name), added[e.name]) for e in entries]
    return out if upto is None else out[:upto]


def stale_variant_messages(selected) -> list[str]:
    """Variants whose message is no longer the 0.2.6 patch's (reworded there): re-export them."""
    return [
        patch.name for entry, patch, _ in selected
        if patch.parent != PATCHES and patch_header(patch.read_text()) != patch_header((PATCHES / entry.name).read_text())
    ]


def patch_header(text: str) -> str:
    """A git-format patch up to its first diff: the mail header and the commit message."""
    i = text.find("\ndiff --git ")
    head = text if i < 0 else text[: i + 1]
    return head.split("\n---\n", 1)[0].rstrip() + "\n"


def has_diff(patch: Path) -> bool:
    text = patch.read_text()
    return text.startswith("diff --git ") or "\ndiff --git " in text


def filter_patch(text: str, keep) -> str:
    """Drop the diff sections of a git-format patch whose path fails keep(path) (e.g. added files)."""
    parts = re.split(r"(?m)^(?=diff --git )", text)
    head, sections = parts[0], parts[1:]
    kept = []
    for s in sections:
        m = re.match(r"diff --git a/(\S+) b/(\S+)", s)
        if m is None or keep(m.group(2)) or keep(m.group(1)):
            kept.append(s)
    return head + "".join(kept)


def patch_sections(text: str) -> list[tuple[str, str]]:
    """(path, section) for each `diff --git` section of a git-format patch."""
    out = []
    for s in re.split(r"(?m)^(?=diff --git )", text)[1:]:
        m = re.match(r"diff --git a/(\S+) b/(\S+)", s)
        if m is not None:
            out.append((m.group(2), s))
    return out


def _adds_file(section: str) -> bool:
    header = section.split("\n@@", 1)[0]
    return "\nnew file mode " in header


def added_file_edits(selected, added_paths: set[str]) -> dict[str, list[tuple[int, str]]]:
    """Added file -> [(patch number, section)] of the later patches that edit it, in series order."""
    edits: dict[str, list[tuple[int, str]]] = {}
    for i, (_, patch, _) in enumerate(selected, 1):
        for path, section in patch_sections(patch.read_text()):
            if path in added_paths and not _adds_file(section):
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
                        f"patch {i}'s edit of {rel} does not reverse from thunder/{rel[len('thunder/'):]} "
                        f"(after reversing the later edits): the added file and the series disagree\n{proc.stderr}"
                    )
            forms[rel] = (tree / rel).read_bytes()
    return forms


# ---------------------------------------------------------------------------------------------------
# compose


def git_apply(patch: Path, tree: Path, *, check: bool = False, reverse: bool = False) -> subprocess.CompletedProcess:
    """`git apply` to a plain directory. The ceiling stops git from finding this repository above
    `tree`; inside a repository, git apply would resolve paths from its top and silently skip them."""
    env = {**os.environ, "GIT_CEILING_DIRECTORIES": str(tree.resolve().parent)}
    cmd = ["git", "apply", "-p1", "--whitespace=nowarn", *(["--check"] if check else []), *(["-R"] if reverse else []), str(patch)]
    return subprocess.run(cmd, cwd=tree, env=env, text=True, capture_output=True)


def _fingerprint(base: Base, selected, forms: dict[str, bytes]) -> str:
    digest = hashlib.sha256(f"{base.key}\0{base.pin_sha256}".encode())
    for entry, patch, added in selected:
        digest.update(f"\0{entry.name}\0{_rel(patch)}\0".encode())
        digest.update(patch.read_bytes())
        for rel in added:
            digest.update(f"\0{rel}\0".encode())
            digest.update(forms[rel])
    return digest.hexdigest()


def compose(out: Path | None = None, *, base: Base | str = DEFAULT_BASE, upto: int | None = None,
            force: bool = False, quiet: bool = False) -> Path:
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
        print(f"patchset: warning: patches/main/ variants whose message differs from the {DEFAULT_BASE} patch's: "
              f"{stale}; refresh them (make edit BASE=main; make export BASE=main)", file=sys.stderr)
    if not quiet:
        n_added = sum(len(a) for _, _, a in selected)
        n_var = sum(p.parent != PATCHES for _, p, _ in selected)
        variants = f", {n_var} of them main variants" if base.variants is not None else ""
        upto_s = f" (patches 1..{upto})" if upto is not None else ""
        print(f"patchset: composed {_rel(out)}: {base.key} base + {len(selected)} patches{variants}{upto_s} + {n_added} added files")
    return out


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
            raise PatchSetError(f"nothing to continue in {_rel(repo)}")
        if _am_in_progress(repo):
            raise PatchSetError(f"git am is still in progress in {_rel(repo)}: resolve, `git am --continue`, then continue")
        state = json.loads(state_file.read_text())
        if [e.name for e, _, _ in selected] != state["series"]:
            raise PatchSetError("patches/series changed since `edit` started; start again (rm -rf the edit repository)")
        start = state["next"]
    else:
        if repo.exists():
            raise PatchSetError(f"{_rel(repo)} exists; export or delete it first (rm -rf {_rel(repo)})")
        base.unpack(repo)
        _git(repo, "init", "-q", "-b", "series")
        _git(repo, "add", "-A")
        _git(repo, "commit", "-q", "-m", f"base: {base.description}")
        _git(repo, "tag", "base")
        # What thunder/ held when the repository was made: export refuses to overwrite later changes.
        state = {
            "base": base.key,
            "series": [e.name for e, _, _ in selected],
            "overlay": {rel: _sha256(ROOT / rel) for rel in overlay_files()},
        }
        start = 0
    for i, (entry, patch, added) in enumerate(selected[start:], start):
        if has_diff(patch):
            try:
                _git(repo, "am", "-q", "--keep-non-patch", str(patch))
            except PatchSetError as e:
                # Stage the patch's added files, so that `git am --continue` commits them with it.
                _copy_added(repo, added, forms)
                if added:
                    _git(repo, "add", "--", *added)
                state_file.write_text(json.dumps({**state, "next": i + 1}))
                flag = f" --base {base.key}" if base.key != DEFAULT_BASE else ""
                raise PatchSetError(
                    f"patch {i + 1} ({_rel(patch)}) does not apply in {_rel(repo)}; git am stopped there.\n"
                    f"  Resolve it (e.g. `git apply --reject .git/rebase-apply/patch`, fix, `git add`), "
                    f"`git am --continue`,\n  then `scripts/patchset.py edit --continue{flag}` for the rest.\n{e}"
                ) from None
        else:
            _git(repo, "am", "-q", "--keep-non-patch", "--empty=keep", str(patch))
        if added:
            _copy_added(repo, added, forms)
            _git(repo, "add", "--", *added)
            _git(repo, "commit", "-q", "--amend", "--no-edit")
    state_file.write_text(json.dumps({**state, "next": len(selected)}))
    print(f"patchset: {_rel(repo)} ready ({len(selected)} patches on the {base.key} base); commit there, then export")


def _commits(repo: Path) -> list[str]:
    return _git(repo, "rev-list", "--reverse", "base..HEAD", capture=True).split()


def _export_checks(repo: Path) -> tuple[set[str], list[str], dict]:
    if not (repo / ".git").exists():
        raise PatchSetError(f"no {_rel(repo)} repository; run edit first")
    if _am_in_progress(repo):
        raise PatchSetError(f"git am is in progress in {_rel(repo)}; finish it (and `edit --continue`) first")
    if subprocess.run(["git", "rev-parse", "-q", "--verify", "refs/tags/overlay"], cwd=repo, capture_output=True).returncode == 0:
        raise PatchSetError(
            f"{_rel(repo)} was made by the old tooling (one 'overlay' commit for all added files); now each patch's "
            f"commit holds the files it adds. Re-make it with edit (move your commits over with git format-patch/am)"
        )
    if _git(repo, "status", "--porcelain", capture=True).strip():
        raise PatchSetError(f"{_rel(repo)} has uncommitted changes; commit them first")
    state = json.loads(_state_path(repo).read_text()) if _state_path(repo).exists() else {}
    if state and state.get("next", 0) < len(state.get("series", [])):
        raise PatchSetError(f"{_rel(repo)} holds only part of the series; `edit --continue` first")
    base_paths = set(_git(repo, "ls-tree", "-r", "--name-only", "base", capture=True).split("\n")) - {""}
    head_paths = set(_git(repo, "ls-tree", "-r", "--name-only", "HEAD", capture=True).split("\n")) - {""}
    outside = sorted(p for p in head_paths - base_paths if not p.startswith("thunder/"))
    if outside:
        raise PatchSetError(f"files outside thunder/ cannot be exported: {outside}")
    added_final = sorted(head_paths - base_paths)
    # Refuse to overwrite files changed in thunder/ after edit copied them (unless the commits agree).
    recorded = state.get("overlay", {})
    clobbered = []
    for rel in sorted(set(overlay_files()) | set(recorded)):
        ours, theirs = ROOT / rel, repo / rel
        now = _sha256(ours) if ours.exists() else None
        if recorded.get(rel) != now:  # changed, added or deleted in thunder/ since edit
            same = theirs.exists() == ours.exists() and (not ours.exists() or theirs.read_bytes() == ours.read_bytes())
            if not same:
                clobbered.append(rel)
    if clobbered:
        raise PatchSetError(
            f"these files in thunder/ changed after edit made {_rel(repo)}; copy them into it (and commit) first: {clobbered}"
        )
    return base_paths, added_final, state


def _added_by_commit(repo: Path, commits: list[str], added_final: list[str]) -> list[list[str]]:
    """For each commit, the files it adds (diff-filter=A) that are still there at HEAD; a file added twice
    belongs to the first commit that added it."""
    seen: set[str] = set()
    final = set(added_final)
    result = []
    for c in commits:
        names = _git(repo, "diff-tree", "-r", "--no-commit-id", "--name-only", "--diff-filter=A", f"{c}^", c, capture=True).split()
        mine = sorted(n for n in names if n in final and n not in seen)
        seen.update(mine)
        result.append(mine)
    return result


def _format_patches(repo: Path, base_paths: set[str]) -> list[tuple[str, str]]:
    """(file name, text) per commit base..HEAD, keeping the diffs of files that exist in the base and the
    edits of added files (a file's adding section is dropped: thunder/ holds the file)."""
    with tempfile.TemporaryDirectory(dir=BUILD) as tmp:
        out = _git(repo, *FORMAT_PATCH, "-o", tmp, "base..HEAD", capture=True).split()
        if len(out) != len(_commits(repo)):
            raise PatchSetError(f"{_rel(repo)}: empty or merge commits in base..HEAD cannot be exported; drop or squash them")
        return [(Path(p).name, _drop_adding_sections(Path(p).read_text())) for p in out]


def _drop_adding_sections(text: str) -> str:
    parts = re.split(r"(?m)^(?=diff --git )", text)
    return parts[0] + "".join(s for s in parts[1:] if not _adds_file(s))


def _reuse_claims(old_claims: list[str], added: list[str], added_final: list[str]) -> list[str] | None:
    """The entry's claims as written before, if they still claim exactly the files the commit adds."""
    if not old_claims:
        return None
    matched = {a for a in added_final if any(_claim_matches(c, a) for c in old_claims)}
    if matched == set(added) and all(any(_claim_matches(c, a) for a in added) for c in old_claims):
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
        old = old_by_name.get(name) or old_by_slug.get(_slug(name))
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
    _rename_variants(entries, old_patch_names)
    n_empty = sum(not has_diff(PATCHES / e.name) for e in entries)
    empty = f" ({n_empty} of them only add files)" if n_empty else ""
    print(f"patchset: exported {len(entries)} patches{empty} and {len(added_final)} added files")


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
        target = by_slug.get(_slug(variant.name), [])
        if len(target) == 1 and not (vdir / target[0]).exists():
            variant.rename(vdir / target[0])
            print(f"patchset: renamed patches/main/{variant.name} -> {target[0]}")
        else:
            print(f"patchset: warning: patches/main/{variant.name} matches no patch of the series any more", file=sys.stderr)


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
            f"{_rel(repo)} has {len(commits)} commits but patches/series {len(entries)} patches; "
            f"add, drop or reorder patches on the {DEFAULT_BASE} side (make edit), then re-make {_rel(repo)}"
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
        print(f"patchset: note: added files changed in {_rel(repo)} were written to thunder/ (shared by both bases): {shared_changed}")


def _needs_variant(repo: Path, commit: str, patch: Path, base_paths: set[str]) -> bool:
    """Whether the 0.2.6 patch, applied on the commit's parent, gives a different tree than the commit."""
    if not has_diff(patch):
        changed = _git(repo, "diff-tree", "-r", "--no-commit-id", "--name-only", f"{commit}^", commit, capture=True).split()
        return any(p in base_paths for p in changed)
    with tempfile.TemporaryDirectory(dir=BUILD) as tmp:
        env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        _git(repo, "read-tree", f"{commit}^", env_extra=env)
        try:
            _git(repo, "apply", "--cached", "--whitespace=nowarn", str(patch), env_extra=env)
        except PatchSetError:
            return True
        tree = _git(repo, "write-tree", env_extra=env, capture=True).strip()
    differ = _git(repo, "diff-tree", "-r", "--name-only", tree, commit, capture=True).split()
    return any(p in base_paths for p in differ)


# ---------------------------------------------------------------------------------------------------
# upstream-diff


def upstream_diff(base: Base | str = DEFAULT_BASE) -> Path:
    """One diff (series + added files) against the pristine base, checked with `git apply --check`."""
    base = get_base(base)
    patched = compose(base=base)
    with tempfile.TemporaryDirectory(dir=BUILD) as tmp:
        repo = Path(tmp) / "repo"
        shutil.copytree(base.ensure_pristine() / "thunder", repo / "thunder")
        _git(repo, "init", "-q")
        _git(repo, "add", "-A")
        _git(repo, "commit", "-q", "-m", "base")
        shutil.rmtree(repo / "thunder")
        shutil.copytree(patched / "thunder", repo / "thunder", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        _git(repo, "add", "-A")
        diff = _git(repo, "diff", "--cached", "--binary", "HEAD", capture=True)
        _git(repo, "reset", "-q", "--hard", "HEAD")
        diff_path = base.diff_path
        diff_path.write_text(diff)
        # The check runs on a fresh pristine tree, not on the repository that produced the diff.
        check_dir = Path(tmp) / "check"
        base.unpack(check_dir)
        proc = git_apply(diff_path, check_dir, check=True)
        if proc.returncode != 0:
            raise PatchSetError(f"{_rel(diff_path)} does not apply to the pristine {base.key} base:\n{proc.stderr}")
    files = diff.count("\ndiff --git ") + diff.startswith("diff --git ")
    print(f"patchset: wrote {_rel(diff_path)} ({files} files); `git apply --check` on pristine {base.key} base: ok")
    return diff_path


def print_series(base: Base | str, upto: int | None) -> None:
    for i, (entry, patch, added) in enumerate(resolved_series(base, upto), 1):
        print(" ".join([str(i), _rel(patch), *added]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)

    def with_base(p):
        p.add_argument("--base", choices=sorted(BASES), default=DEFAULT_BASE,
                       help=f"which base to work on (default {DEFAULT_BASE})")
        return p

    p = with_base(sub.add_parser("compose"))
    p.add_argument("--out", type=Path)
    p.add_argument("--upto", type=int, help="only patches 1..N of the series (and the files they add)")
    p.add_argument("--force", action="store_true")
    p = with_base(sub.add_parser("edit"))
    p.add_argument("--continue", dest="resume", action="store_true",
                   help="go on after a patch that stopped git am was resolved and committed")
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
