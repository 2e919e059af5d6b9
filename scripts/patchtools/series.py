"""patches/series: the entries, the added-file claims, the main variants, and patch-text helpers."""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field
from pathlib import Path

from patchtools.common import PATCHES, PatchSetError, ROOT, SERIES
from patchtools.bases import BASES, Base, get_base


# ---------------------------------------------------------------------------------------------------
# The series: entries, claims, variants


@dataclass
class Entry:
    name: str
    claims: list[str] = field(default_factory=list)

    @property
    def slug(self) -> str:
        return slug_of(self.name)


def slug_of(name: str) -> str:
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
                raise PatchSetError(
                    f"patches/series:{lineno}: an indented line continues an entry, but none precedes it"
                )
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


def claim_matches(claim: str, path: str) -> bool:
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
            hits = [f for f in files if claim_matches(claim, f)]
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
        problems.append(
            f"files under thunder/ that no patch claims (add them to an entry in patches/series): {unclaimed}"
        )
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
        elif len(by_slug.get(slug_of(variant.name), [])) == 1:
            target = by_slug[slug_of(variant.name)][0].name
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
        patch.name
        for entry, patch, _ in selected
        if patch.parent != PATCHES
        and patch_header(patch.read_text()) != patch_header((PATCHES / entry.name).read_text())
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
