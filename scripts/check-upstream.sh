#!/usr/bin/env bash
# Which patches of the series apply, in order, to another Thunder tree (e.g. upstream main):
#   scripts/check-upstream.sh /path/to/lightning-thunder-checkout
# Works on a scratch copy of its thunder/ package; prints ok/FAIL per patch.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
src=${1:?usage: scripts/check-upstream.sh PATH_TO_THUNDER_CHECKOUT}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp -r "$src/thunder" "$tmp/thunder"
cd "$tmp"
status=0
while read -r p; do
  [ -z "$p" ] && continue
  if GIT_CEILING_DIRECTORIES="$(dirname "$tmp")" git apply -p1 "$root/patches/$p" 2>"$tmp/err"; then
    echo "ok   $p"
  else
    echo "FAIL $p: $(head -1 "$tmp/err")"
    status=1
  fi
done < "$root/patches/series"
exit $status
