"""Paths, the error type and the git helpers the patch-set tools share."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
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


def run_git(cwd: Path, *args: str, capture: bool = False, env_extra: dict | None = None) -> str:
    env = {**os.environ, **GIT_ENV, **(env_extra or {})}
    proc = subprocess.run(["git", *args], cwd=cwd, env=env, text=True, capture_output=True)
    if proc.returncode != 0:
        raise PatchSetError(f"git {' '.join(args)} failed in {cwd}:\n{proc.stdout}{proc.stderr}")
    return proc.stdout if capture else ""


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def relative_to_root(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def git_apply(patch: Path, tree: Path, *, check: bool = False, reverse: bool = False) -> subprocess.CompletedProcess:
    """`git apply` to a plain directory. The ceiling stops git from finding this repository above
    `tree`; inside a repository, git apply would resolve paths from its top and silently skip them."""
    env = {**os.environ, "GIT_CEILING_DIRECTORIES": str(tree.resolve().parent)}
    cmd = [
        "git",
        "apply",
        "-p1",
        "--whitespace=nowarn",
        *(["--check"] if check else []),
        *(["-R"] if reverse else []),
        str(patch),
    ]
    return subprocess.run(cmd, cwd=tree, env=env, text=True, capture_output=True)
