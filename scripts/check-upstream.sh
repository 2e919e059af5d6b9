#!/usr/bin/env bash
# Which patches of the series apply, in order, to another Thunder tree (e.g. a checkout of upstream main):
#   scripts/check-upstream.sh /path/to/lightning-thunder-checkout [0.2.6|main]
# The second argument picks which patches: the 0.2.6 ones (default) or the main variants where they exist.
# Works on a scratch copy of its thunder/ package, added files included; prints ok/FAIL per patch.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
src=${1:?usage: scripts/check-upstream.sh PATH_TO_THUNDER_CHECKOUT [0.2.6|main]}
base=${2:-0.2.6}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp -r "$src/thunder" "$tmp/thunder"
"$root/.venv/bin/python" "$root/scripts/patchset.py" series --base "$base" > "$tmp/series" || exit 2
cd "$tmp"
status=0
while read -r n patch added; do
  for f in $added; do mkdir -p "$(dirname "$f")"; cp "$root/$f" "$f"; done
  if GIT_CEILING_DIRECTORIES="$(dirname "$tmp")" git apply -p1 "$root/$patch" 2>"$tmp/err"; then
    echo "ok   $n $patch"
  else
    echo "FAIL $n $patch: $(head -1 "$tmp/err")"
    status=1
  fi
done < "$tmp/series"
exit $status
