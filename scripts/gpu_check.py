"""`make gpu-check`: the in-place write tests and the fusion-pass cases on CUDA under nvFuser, one summary line.

On a machine with CUDA and nvFuser it runs, in the composed tree (build/patched, as scripts/run-tests.sh does),
the nvFuser-on-CUDA tests of thunder/tests/test_inplace_indexed_writes_fusion.py:

  write_forms        every write form of test_inplace_indexed_writes.py between a fused read of its destination
                     before the write and one after it; the caller's buffer must equal eager's bitwise
  nv_enable_scatter  write forms with nv_enable_scatter=True (nvFuser also claims index_put / scatter)
  rematerialization  a fused read of the destination is not recomputed after the write
  cse                the same expression of the destination before and after a write is not merged
  clone_2793         `y = x.clone(); y[i] = v` leaves x alone and y no alias of x (upstream #2793)
  diagonal_view      a write through `diagonal` (a gather in Thunder) lands in its base (0074), jit and ThunderFX
  cudagraph_decode   a decode step (index_copy_ into the KV cache, then attention scores) under Thunder's
                     CUDAGraphTransform: the write lands in the caller's cache, step after step, not in a static copy

Then the differential fuzzer on CUDA (tests/test_fuzz_inplace_writes.py with FUZZ_DEVICE=cuda: random programs of
in-place writes, each under one of jit, ThunderFX, grad, symbolic values, torch_compile_ex, nv_enable_scatter, with
nvFuser the default fusion executor; `--stock` reruns what failed on the pristine base, so a program stock gets
right and this build does not is a REGRESSION). It prints one line: `gpu-check: PASS|FAIL n/N (check k/K, ...;
fuzz ok/P, ...) on <GPU>, nvFuser <v>, torch <v>`. PASS needs every check and no fuzz REGRESSION; fuzz failures
that stock shares are counted, not failed on. Without CUDA it prints `gpu-check: SKIPPED: ...` and exits 0 (CPU
CI runs the same tests under the CPU stand-in for nvFuser).

  .venv/bin/python scripts/gpu_check.py [--tree build/patched] [--fuzz PROGRAMS] [-- PYTEST_ARGS...]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TEST_FILE = "thunder/tests/test_inplace_indexed_writes_fusion.py"
# check -> the test (name prefix) that runs it on CUDA under nvFuser
CHECKS = {
    "write_forms": "test_write_form_with_reads_around_it_nvfuser_cuda",
    "nv_enable_scatter": "test_write_form_with_nv_enable_scatter_nvfuser_cuda",
    "rematerialization": "test_fused_read_is_not_rematerialized_after_the_write_nvfuser_cuda",
    "cse": "test_reads_on_either_side_of_a_write_are_not_merged_nvfuser_cuda",
    "clone_2793": "test_write_into_a_clone_leaves_the_input_alone_nvfuser_cuda",
    "diagonal_view": "test_write_through_a_diagonal_lands_in_its_base_nvfuser_cuda",
    "cudagraph_decode": "test_decode_step_under_cuda_graphs_writes_the_callers_cache",
}


def _pythonpath(tree: Path) -> str:
    """The composed tree in front of whatever PYTHONPATH already holds (carried packages on a device machine)."""
    return os.pathsep.join(p for p in (str(tree), os.environ.get("PYTHONPATH", "")) if p)


def _environment(tree: Path) -> tuple[str | None, str]:
    """(why it cannot run here or None, a description of the device and versions)."""
    probe = (
        "import torch, thunder.executors as e\n"
        "cuda = torch.cuda.is_available()\n"
        "print(int(cuda), int(e.nvfuser_available()), torch.__version__,"
        " e.get_nvfuser_executor().version if e.nvfuser_available() else '-',"
        " torch.cuda.get_device_name(0).replace(' ', '_') if cuda else '-')\n"
    )
    env = dict(os.environ, PYTHONPATH=_pythonpath(tree))
    proc = subprocess.run([sys.executable, "-W", "ignore", "-c", probe], env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        return f"cannot import Thunder from {tree}: {proc.stderr.strip().splitlines()[-1:]}", ""
    cuda, nvfuser, torch_version, nvfuser_version, device = proc.stdout.split()[-5:]
    about = f"{device.replace('_', ' ')}, nvFuser {nvfuser_version}, torch {torch_version}"
    if device == "-":
        about = f"torch {torch_version}" + (f", nvFuser {nvfuser_version}" if nvfuser_version != "-" else "")
    if cuda != "1":
        return "no CUDA device here (torch.cuda.is_available() is False)", about
    if nvfuser != "1":
        return "CUDA is here but nvFuser is not (pip install nvfuser-cu128-torch29 for torch 2.9)", about
    return None, about


def _results(junit: Path) -> dict[str, dict[str, int]]:
    """check -> {"passed": n, "failed": n, "skipped": n} from pytest's JUnit XML."""
    counts: dict[str, dict[str, int]] = defaultdict(lambda: {"passed": 0, "failed": 0, "skipped": 0})
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = case.get("name", "")
        check = next((c for c, prefix in CHECKS.items() if name.startswith(prefix)), None)
        if check is None:
            continue
        tags = {child.tag for child in case}
        outcome = "failed" if tags & {"failure", "error"} else "skipped" if "skipped" in tags else "passed"
        counts[check][outcome] += 1
    return counts


def _fuzz(tree: Path, programs: int, seed: int, seconds: float, keep: Path | None) -> tuple[str, bool]:
    """The fuzzer on CUDA, each program under one backend, stock rerunning what failed: (summary, no regression).
    keep: where to leave the fuzzer's JSON (every outcome, the failures' details)."""
    if programs <= 0:
        return "", True
    with tempfile.TemporaryDirectory() as tmp:
        summary = keep or Path(tmp) / "fuzz.json"
        summary.unlink(missing_ok=True)
        cmd = [sys.executable, "-W", "ignore", str(ROOT / "tests" / "test_fuzz_inplace_writes.py"), "--programs",
               str(programs), "--seed", str(seed), "--spread", "--stock", "--repros", "3", "--shrink-budget", "10",
               "--seconds", str(seconds), "--json", str(summary), "--forms", "diagonal"]
        env = dict(os.environ, FUZZ_DEVICE="cuda", PYTHONPATH=_pythonpath(tree), PYTHONHASHSEED="0")
        subprocess.run(cmd, cwd=ROOT, env=env)
        if not summary.exists():
            return "fuzz did not finish", False
        data = json.loads(summary.read_text())["standalone"]
    counts: dict[str, int] = defaultdict(int)
    for _, _, category in data["outcomes"]:
        counts[category] += 1
    shown = ", ".join(f"{k.lower()} {counts[k]}" for k in ("MISMATCH", "CRASH", "UNSUPPORTED", "REGRESSION") if counts[k])
    return f"fuzz ok {counts['OK']}/{data['programs']}{f' ({shown})' if shown else ''}", counts["REGRESSION"] == 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tree", type=Path, default=ROOT / "build" / "patched", help="the composed Thunder tree to test")
    p.add_argument("--fuzz", type=int, default=64, help="fuzz programs on CUDA after the tests (0: none)")
    p.add_argument("--fuzz-seed", type=int, default=200_000, help="first fuzz seed")
    p.add_argument("--fuzz-seconds", type=float, default=600, help="start no fuzz program after this many seconds")
    p.add_argument("--fuzz-json", type=Path, help="keep the fuzzer's JSON summary here")
    p.add_argument("pytest_args", nargs="*", help="more pytest arguments (after --)")
    args = p.parse_args(argv)
    tree = args.tree.resolve()
    why, about = _environment(tree)
    if why is not None:
        print(f"gpu-check: SKIPPED: {why}; nothing ran{f' ({about})' if about else ''}")
        return 0 if "no CUDA" in why else 1
    selection = " or ".join(CHECKS.values())
    with tempfile.TemporaryDirectory() as tmp:
        junit = Path(tmp) / "gpu-check.xml"
        cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-W", "ignore", "-q", TEST_FILE,
               "-k", selection, f"--junitxml={junit}", *args.pytest_args]
        proc = subprocess.run(cmd, cwd=tree, env=dict(os.environ, PYTHONPATH=_pythonpath(tree)))
        counts = _results(junit) if junit.exists() else {}
    fuzz, fuzz_ok = _fuzz(tree, args.fuzz, args.fuzz_seed, args.fuzz_seconds, args.fuzz_json)
    missing = [c for c in CHECKS if sum(counts.get(c, {}).values()) == 0]
    failed = [c for c in CHECKS if counts.get(c, {}).get("failed", 0)]
    skipped = [c for c in CHECKS if c not in missing and counts[c]["passed"] == 0]
    passed = sum(c["passed"] for c in counts.values())
    total = sum(c["passed"] + c["failed"] for c in counts.values())
    ok = proc.returncode == 0 and not (missing or failed or skipped) and fuzz_ok
    ran = [c for c in CHECKS if c not in missing]
    parts = [f"{c} {counts[c]['passed']}/{counts[c]['passed'] + counts[c]['failed']}" for c in ran]
    parts += [f"{c} did not run" for c in missing]
    parts += [fuzz] if fuzz else []
    extra = f"; failed: {', '.join(failed)}" if failed else ""
    extra += f"; skipped: {', '.join(skipped)}" if skipped else ""
    print(f"gpu-check: {'PASS' if ok else 'FAIL'} {passed}/{total} ({', '.join(parts)}) on {about}{extra}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
