#!/usr/bin/env python3
"""Compose, edit and export the patch set against the pinned lightning-thunder base.

The repository never holds Thunder's own code. Everything here is derived from three inputs:

* the base wheel pinned in ``scripts/base.json`` (downloaded from PyPI, sha256-checked),
* ``thunder/`` at the top of this repository: the files this set *adds*, at their upstream paths,
* ``patches/series``: git-format patches that *edit* files of the base, applied in order.

Subcommands (all idempotent; ``make`` wraps them):

``compose``        unpack the base into ``build/base`` (pristine) and build ``build/patched``
                   = base + ``thunder/`` + series. Fails naming the first patch that does not apply.
``edit``           make ``build/edit``, a git repository with one commit for the base, one for the
                   added files and one per patch, to edit the series with ordinary git.
``export``         write ``build/edit``'s commits back to ``patches/`` + ``series`` and its added
                   files back to ``thunder/``.
``upstream-diff``  write ``build/upstream.diff`` (series + added files as one diff) and check that it
                   applies with ``git apply --check`` to a pristine copy of the base.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BASE_PIN = json.loads((ROOT / "scripts" / "base.json").read_text())
CACHE = ROOT / ".cache" / "base"
BUILD = ROOT / "build"
OVERLAY = ROOT / "thunder"
PATCHES = ROOT / "patches"

# Commit identity for the scratch repositories this script makes; it never touches the user's config.
GIT_ENV = {
    "GIT_AUTHOR_NAME": "patchset",
    "GIT_AUTHOR_EMAIL": "patchset@localhost",
    "GIT_COMMITTER_NAME": "patchset",
    "GIT_COMMITTER_EMAIL": "patchset@localhost",
    "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z",
    "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z",
}


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


def base_requirements() -> list[str]:
    """The base wheel's own runtime requirements (Requires-Dist without extras)."""
    with zipfile.ZipFile(base_wheel()) as zf:
        (meta,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        lines = zf.read(meta).decode().splitlines()
    reqs = [ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("Requires-Dist:")]
    return [r for r in reqs if "extra ==" not in r]


def series() -> list[Path]:
    """Patches in application order, as listed in patches/series (blank lines and # comments skipped)."""
    series_file = PATCHES / "series"
    if not series_file.exists():
        return []
    names = [ln.strip() for ln in series_file.read_text().splitlines()]
    names = [n for n in names if n and not n.startswith("#")]
    missing = [n for n in names if not (PATCHES / n).exists()]
    if missing:
        raise PatchSetError(f"patches/series names missing files: {missing}")
    return [PATCHES / n for n in names]


def overlay_files() -> list[Path]:
    """Files this set adds, relative to the repository root (so they start with thunder/)."""
    return sorted(
        p.relative_to(ROOT)
        for p in OVERLAY.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and not p.name.endswith(".pyc")
    )


def unpack_base(dest: Path) -> None:
    """Extract only the `thunder` package of the base wheel (not its dist-info) into dest."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    with zipfile.ZipFile(base_wheel()) as zf:
        for name in zf.namelist():
            if name.startswith("thunder/"):
                zf.extract(name, dest)


def _inputs_fingerprint() -> str:
    digest = hashlib.sha256(BASE_PIN["sha256"].encode())
    for path in [*overlay_files(), *(p.relative_to(ROOT) for p in series())]:
        digest.update(str(path).encode())
        digest.update((ROOT / path).read_bytes())
    return digest.hexdigest()


def copy_overlay(dest: Path) -> None:
    for rel in overlay_files():
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, target)


def git_apply(patch: Path, tree: Path, *, check: bool = False) -> subprocess.CompletedProcess:
    """`git apply` to a plain directory. The ceiling stops git from finding this repository above
    `tree`; inside a repository, git apply would resolve paths from its top and silently skip them."""
    env = {**os.environ, "GIT_CEILING_DIRECTORIES": str(tree.resolve().parent)}
    cmd = ["git", "apply", "-p1", "--whitespace=nowarn", *(["--check"] if check else []), str(patch)]
    return subprocess.run(cmd, cwd=tree, env=env, text=True, capture_output=True)


def apply_series(dest: Path) -> None:
    for patch in series():
        proc = git_apply(patch, dest)
        if proc.returncode != 0:
            raise PatchSetError(f"patch {patch.name} does not apply to the composed tree:\n{proc.stderr}")


def compose(out: Path | None = None, *, force: bool = False) -> Path:
    """build/base = pristine base; build/patched (or `out`) = base + overlay + series."""
    out = (out or BUILD / "patched").resolve()
    stamp = out / ".patchset-stamp"
    fingerprint = _inputs_fingerprint()
    base_dir = BUILD / "base"
    if not (base_dir / "thunder" / "__init__.py").exists():
        unpack_base(base_dir)
    if not force and stamp.exists() and stamp.read_text() == fingerprint:
        return out
    staging = Path(tempfile.mkdtemp(prefix="patched-", dir=BUILD))
    try:
        shutil.copytree(base_dir / "thunder", staging / "thunder")
        collisions = [str(p) for p in overlay_files() if (base_dir / p).exists()]
        if collisions:
            raise PatchSetError(f"thunder/ overlay must only add files, but these exist in the base: {collisions}")
        copy_overlay(staging)
        apply_series(staging)
        (staging / ".patchset-stamp").write_text(fingerprint)
        if out.exists():
            shutil.rmtree(out)
        staging.rename(out)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    print(f"patchset: composed {out.relative_to(ROOT)} (base + {len(overlay_files())} added files + {len(series())} patches)")
    return out


BASE_MSG = f"base: lightning-thunder {BASE_PIN['version']} (pristine, from the PyPI wheel)"
OVERLAY_MSG = "overlay: files this patch set adds (exported to thunder/, not to patches/)"


def edit() -> None:
    """build/edit: base commit, overlay commit, then one commit per patch (git am keeps the messages)."""
    repo = BUILD / "edit"
    if repo.exists():
        raise PatchSetError(f"{repo} exists; export or delete it first (rm -rf {repo})")
    unpack_base(repo)
    _git(repo, "init", "-q", "-b", "series")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", BASE_MSG)
    _git(repo, "tag", "base")
    copy_overlay(repo)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "--allow-empty", "-m", OVERLAY_MSG)
    _git(repo, "tag", "overlay")
    for patch in series():
        try:
            _git(repo, "am", "-q", "--keep-non-patch", str(patch))
        except PatchSetError as e:
            raise PatchSetError(f"patch {patch.name} does not apply in build/edit:\n{e}") from None
    print(f"patchset: {repo.relative_to(ROOT)} ready; commit there, then `make export`")


def export() -> None:
    repo = BUILD / "edit"
    if not (repo / ".git").exists():
        raise PatchSetError("no build/edit repository; run `make edit` first")
    if _git(repo, "status", "--porcelain", capture=True).strip():
        raise PatchSetError("build/edit has uncommitted changes; commit them first")
    added = _git(repo, "diff", "--name-only", "--diff-filter=A", "base", "HEAD", capture=True).split()
    edited = _git(repo, "diff", "--name-only", "--diff-filter=MDR", "base", "HEAD", capture=True).split()
    # Refuse to overwrite overlay files edited in this repository since `make edit` copied them.
    changed_here = []
    for rel in overlay_files():
        at_edit = subprocess.run(["git", "show", f"overlay:{rel}"], cwd=repo, capture_output=True).stdout
        if (ROOT / rel).read_bytes() != at_edit and (repo / rel).exists() and (repo / rel).read_bytes() != (ROOT / rel).read_bytes():
            changed_here.append(str(rel))
    if changed_here:
        raise PatchSetError(
            f"these overlay files changed in thunder/ after `make edit`; copy them into build/edit first: {changed_here}"
        )
    # Added files go to the overlay; a commit that only adds files produces no patch.
    if OVERLAY.exists():
        shutil.rmtree(OVERLAY)
    for rel in added:
        target = ROOT / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(repo / rel, target)
    for old in PATCHES.glob("*.patch"):
        old.unlink()
    PATCHES.mkdir(exist_ok=True)
    names: list[str] = []
    if edited:
        out = _git(
            repo,
            "format-patch", "--no-signature", "--zero-commit", "--no-stat", "-N",
            "-o", str(PATCHES), "overlay..HEAD", "--", *edited,
            capture=True,
        )
        names = [Path(line).name for line in out.split()]
    (PATCHES / "series").write_text("".join(f"{n}\n" for n in names))
    print(f"patchset: exported {len(names)} patches and {len(added)} added files")


def upstream_diff() -> Path:
    """One diff (series + added files) against the pristine base, checked with `git apply --check`."""
    patched = compose()
    with tempfile.TemporaryDirectory(dir=BUILD) as tmp:
        repo = Path(tmp) / "repo"
        unpack_base(repo)
        _git(repo, "init", "-q")
        _git(repo, "add", "-A")
        _git(repo, "commit", "-q", "-m", "base")
        shutil.rmtree(repo / "thunder")
        shutil.copytree(patched / "thunder", repo / "thunder", ignore=shutil.ignore_patterns("__pycache__"))
        _git(repo, "add", "-A")
        diff = _git(repo, "diff", "--cached", "--binary", "HEAD", capture=True)
        _git(repo, "reset", "-q", "--hard", "HEAD")
        diff_path = BUILD / "upstream.diff"
        diff_path.write_text(diff)
        # The check runs on a fresh pristine tree, not on the repository that produced the diff.
        check_dir = Path(tmp) / "check"
        unpack_base(check_dir)
        proc = git_apply(diff_path, check_dir, check=True)
        if proc.returncode != 0:
            raise PatchSetError(f"build/upstream.diff does not apply to the pristine base:\n{proc.stderr}")
    files = diff.count("\ndiff --git ") + diff.startswith("diff --git ")
    print(f"patchset: wrote build/upstream.diff ({files} files); `git apply --check` on pristine base: ok")
    return diff_path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("compose")
    p.add_argument("--out", type=Path)
    p.add_argument("--force", action="store_true")
    sub.add_parser("edit")
    sub.add_parser("export")
    sub.add_parser("upstream-diff")
    args = parser.parse_args(argv)
    try:
        if args.cmd == "compose":
            compose(args.out, force=args.force)
        elif args.cmd == "edit":
            edit()
        elif args.cmd == "export":
            export()
        elif args.cmd == "upstream-diff":
            upstream_diff()
    except PatchSetError as e:
        print(f"patchset: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
