#!/usr/bin/env bash
# The suite of `make test` (0.2.6 base) against another torch release, in its own venv (.venv-torch-VERSION):
#   scripts/test-torch.sh 2.13.0        (make test-torch VERSION=2.13.0)
# The venv gets that torch (a local CPU wheel in /opt/wheels when there is one, else PyPI) and the other pins
# of requirements.lock; the composed trees are the ones `make setup` made. Where pip is capped at an older torch
# (/etc/xdg/pip on this machine), a newer release needs the cap lifted for this call only:
#   PIP_CONFIG_FILE=/dev/null make test-torch VERSION=2.15.0
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
version=${1:?usage: scripts/test-torch.sh VERSION}
venv=.venv-torch-$version
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv" || exit 1
  wheel=$(ls /opt/wheels/torch-"$version"+cpu-*.whl 2>/dev/null | head -1)
  "$venv/bin/pip" install --quiet --disable-pip-version-check "${wheel:-torch==$version}" || exit 1
  # torch's own dependencies (its CUDA libraries, triton) are pinned for the lock's torch: leave them to this one
  grep -v -E '^(torch|triton|nvidia-[a-z0-9-]+)==' requirements.lock > "$venv/requirements.txt"
  "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$venv/requirements.txt" || exit 1
fi
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$root/build/patched" > "$site/lightning_thunder_inplace_writes.pth"
echo "test-torch: torch $("$venv/bin/python" -c 'import torch; print(torch.__version__)')"
VENV=$venv bash scripts/run-tests.sh 0.2.6 -q -m "not slow" "${@:2}"
