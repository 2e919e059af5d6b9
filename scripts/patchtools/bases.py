"""The two bases: the pinned 0.2.6 wheel (PyPI, sha256-checked) and upstream main (a pinned tarball)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from patchtools.common import BASE_PIN, BUILD, CACHE, MAIN_PIN, PATCHES, PatchSetError, ROOT, sha256_of


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
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--no-deps",
                "--only-binary=:all:",
                "-d",
                str(CACHE),
                spec,
            ]
        )
        if proc.returncode != 0 or not wheel.exists():
            # pip is not importable inside an isolated build environment (`pip install .`): ask PyPI directly.
            _download_from_pypi(wheel)
    actual = sha256_of(wheel)
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
    actual = sha256_of(tarball)
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
        if not (
            stamp.exists()
            and stamp.read_text() == self.pin_sha256
            and (self.base_dir / "thunder" / "__init__.py").exists()
        ):
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
