#!/usr/bin/env bash
# Pre-commit as upstream configures it (ruff format + ruff check, the settings in pyproject.toml) on the
# files the series adds or changes, in the composed trees (0.2.6 and main). `make test` runs it first.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
ruff=.venv/bin/ruff
status=0
for tree in build/patched build/patched-main; do
  [ -d "$tree" ] || continue
  mapfile -t files < <(.venv/bin/python - "$tree" <<'PY'
import glob, re, sys
from pathlib import Path
tree = Path(sys.argv[1])
files = {str(p) for p in Path("thunder").rglob("*.py")}  # the added files
patch_dirs = ["patches", "patches/main"] if "main" in tree.name else ["patches"]
for d in patch_dirs:
    for p in glob.glob(f"{d}/0*.patch"):
        files.update(m.group(1) for m in re.finditer(r"^diff --git a/(\S+)", open(p).read(), re.M))
print("\n".join(sorted(f for f in files if f.endswith(".py") and (tree / f).exists())))
PY
  )
  (cd "$tree" && "$root/$ruff" format --config "$root/pyproject.toml" --check "${files[@]}") || status=1
  (cd "$tree" && "$root/$ruff" check --output-format concise --config "$root/pyproject.toml" "${files[@]}") || status=1
done
[ $status -eq 0 ] && echo "lint: ruff format and ruff check clean on the files the series adds or changes"
exit $status
