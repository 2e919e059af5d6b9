#!/usr/bin/env bash
# The GPU checks in one call of a lent device machine (a CUDA machine that reaches no package registry and has
# its own python3 with torch). Run from the repository root there, with build/ and .whl/ carried:
#
#   bash scripts/device-run.sh [FUZZ_PROGRAMS]
#
# DEVICE_BASE=main (the default; carry build/patched-main and build/base-main) or 0.2.6 (build/patched, build/base).
# nvFuser's builds for torch 2.10 and later ship only the nvfuser_direct module; Thunder 0.2.6 still imports the
# old nvfuser module for every fusion's tensor descriptors (ModuleNotFoundError on the H200 on 2026-12-04, stock
# and patched), so with those builds only main's Thunder runs nvFuser.
#
# .whl/ holds what that python3 lacks (CONTRIBUTING.md, "A GPU run", says how to fill it): Thunder's
# dependencies as wheels and nvFuser as nvfuser-*.tar.xz, a wheel's files without its bundled NVRTC (the torch
# there ships one) so that it fits the 64 MiB a call carries. Everything it writes goes to $OUT (the device
# tool's output folder; a new temporary folder elsewhere):
#   gpu-check.log      make gpu-check's run (scripts/gpu_check.py): the write tests on CUDA under nvFuser, then
#                      the fuzzer on CUDA with stock rerunning what failed; its last line is the summary
#   upstream-*.log     upstream's in-place suites (test_update_aliases.py, test_inplace_copy.py) on CUDA,
#                      patched and stock, one line a test (a test failing patched and passing stock is a regression)
#   bench.json         the headline write (k_buffer[loc] = k) on CUDA: eager, Inductor, stock and patched Thunder
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
out=${OUT:-$(mktemp -d)}
mkdir -p "$out"
fuzz_programs=${1:-96}
site=$(mktemp -d)  # the carried packages, installed here
case "${DEVICE_BASE:-main}" in
  main) patched=patched-main; stock=base-main; export STOCK_BASE=main ;;
  0.2.6) patched=patched; stock=base ;;
  *) echo "device-run: DEVICE_BASE must be main or 0.2.6" >&2; exit 2 ;;
esac
log() { echo "device-run: $*" | tee -a "$out/device-run.log"; }

python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .whl/*.whl \
  || log "installing the carried wheels failed"
mkdir -p "$site"
for t in .whl/nvfuser-*.tar.xz; do
  [ -f "$t" ] && tar xJf "$t" -C "$site"
done
# nvFuser's libraries name the NVRTC their wheel bundled; the one that came with torch serves.
for libs in "$site"/nvfuser_*.libs; do
  [ -d "$libs" ] || continue
  want=$(cd "$site/nvfuser_common/lib" && readelf -d libnvfuser_codegen.so | sed -n 's/.*Shared library: \[\(libnvrtc-[^]]*\)\].*/\1/p')
  have=$(python3 -c 'import glob, site; print(next(iter(sorted(p for d in site.getsitepackages() for p in glob.glob(d + "/nvidia/**/libnvrtc.so*", recursive=True))), ""))')
  if [ -n "$want" ] && [ -n "$have" ]; then ln -sf "$have" "$libs/$want"; else log "no NVRTC for nvFuser (want '$want', have '$have')"; fi
done
export PYTHONPATH="$site"
# nvFuser's newest PyPI build is for torch 2.10; on a later torch its one stale import (c10::MessageLogger) is
# served by a shim (scripts/device/nvfuser_logger_shim.cpp says why that is enough).
codegen="$site/nvfuser_common/lib/libnvfuser_codegen.so"
why=$(python3 -c "import nvfuser_direct" 2>&1)  # (not piped into grep: pipefail takes python's exit status)
if [ -f "$codegen" ] && [[ "$why" == *MessageLogger* ]]; then
  python3 - "$codegen" <<'PY'
import sys
path = sys.argv[1]
data = open(path, "rb").read()
old, new = b"_ZN3c1013MessageLogger", b"_ZN3c1013NvfShimLogger"  # same length: the string table keeps its layout
open(path, "wb").write(data.replace(old, new))
print(f"nvFuser: {data.count(old)} imports of c10::MessageLogger renamed to the shim's")
PY
  g++ -O2 -shared -fPIC -o "$site/libnvfshim.so" scripts/device/nvfuser_logger_shim.cpp 2>>"$out/device-run.log" \
    || cp .whl/libnvfshim.so "$site/libnvfshim.so"
  export LD_PRELOAD="$site/libnvfshim.so"
fi
# scripts/python-stock and scripts/bench.py call .venv/bin/python: here that is the machine's python3.
if [ ! -x .venv/bin/python ]; then
  mkdir -p .venv/bin
  printf '#!/bin/sh\nexec python3 "$@"\n' > .venv/bin/python
  chmod +x .venv/bin/python
fi
# So that the bench's patched side imports the composed tree (make setup's .pth does this on a dev machine).
export PYTHONPATH="$site:$root/build/$patched"
python3 - <<'PY' 2>&1 | tee -a "$out/device-run.log"
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA")
try:
    import nvfuser_direct
    print("nvfuser_direct", nvfuser_direct.version())
except Exception as e:  # what keeps nvFuser from loading is the thing to know
    print("nvfuser_direct does not import:", type(e).__name__, str(e)[:400])
import thunder
print("thunder", thunder.__version__, thunder.__file__)
PY

# Correctness jobs side by side (the machine has 16 cores), each with its own time limit.
(
  timeout "${CHECK_S:-300}" python3 scripts/gpu_check.py --tree "build/$patched" --fuzz "$fuzz_programs" --fuzz-seconds "${FUZZ_S:-150}" --fuzz-json "$out/fuzz.json" \
    > "$out/gpu-check.log" 2>&1
  if grep -q "nvFuser is not" "$out/gpu-check.log"; then  # still the fuzzer on CUDA, under Thunder's other executors
    FUZZ_DEVICE=cuda timeout 200 python3 -W ignore tests/test_fuzz_inplace_writes.py --programs "$fuzz_programs" \
      --seed 200000 --spread --stock --repros 3 --shrink-budget 10 --seconds 130 --json "$out/fuzz.json" \
      >> "$out/gpu-check.log" 2>&1
  fi
) &
for side in "$patched" "$stock"; do
  (cd "build/$side" && PYTHONPATH="$site:$root/build/$side" timeout "${UPSTREAM_S:-280}" python3 -m pytest -p no:cacheprovider -W ignore \
    -v -k "${UPSTREAM_K:-cuda}" thunder/tests/test_update_aliases.py thunder/tests/test_inplace_copy.py \
    > "$out/upstream-$side.log" 2>&1) &
done
wait
tail -n 1 "$out/gpu-check.log" | tee -a "$out/device-run.log"
for side in "$patched" "$stock"; do log "upstream in-place suites on CUDA, $side: $(tail -n 1 "$out/upstream-$side.log")"; done

# The headline write on CUDA, alone on the machine (timings). BENCH_S=0: none.
[ "${BENCH_S:-150}" = 0 ] && exit 0
timeout "${BENCH_S:-150}" .venv/bin/python scripts/bench.py --device cuda --workloads a --sizes ${BENCH_SIZES:-4096 2615232} --out "$out/bench" \
  > "$out/bench.log" 2>&1
cp "$out"/bench/latest.json "$out/bench.json" 2>/dev/null && rm -rf "$out/bench"
log "bench: $(tail -n 1 "$out/bench.log")"
