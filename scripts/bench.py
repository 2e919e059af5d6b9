"""`make bench`: the in-place writes benchmark, stock Thunder against the patched build, in one report.

The benchmark itself is the upstream-path package ``thunder.benchmarks.inplace_writes``; it measures the
Thunder it is imported with. This script is the repository's A/B around it:

* stock side: a child process through ``scripts/python-stock`` (the same interpreter with the pristine
  base Thunder) loads the same package files (the pristine base has none) and runs its workloads with
  Thunder's defaults, ``thunderfx-default`` and ``jit-default``, reported as ``thunderfx-stock`` and
  ``jit-stock``. ``thunder.examine.full_size_copies`` (added by this set) is loaded into it by path so
  the stock traces are inspected the same way. It runs first and alone, so that its buffers and this
  process's are never live together.
* patched side: this process, ``.venv/bin/python`` with ``build/patched``, every backend of the build.

One table, ``<out>/<stamp>.json`` and ``.png`` (+ ``latest.*``) as the package writes them, plus the git
revision (``-dirty`` when tracked or untracked files other than ``results/`` differ from it), both
builds' versions, and how many cores other processes used during the run (``/proc`` accounting; CPU
timings here are very sensitive to them). Paths in the JSON are relative to the repository.

    make bench                          # == .venv/bin/python scripts/bench.py
    make bench ARGS="--quick"           # CI size; ARGS takes every option of the package, plus --no-stock
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Stock backend (as reported) -> the package's backend run in the stock child.
STOCK = {"thunderfx-stock": "thunderfx-default", "jit-stock": "jit-default"}
ORDER = ("eager", "inductor", "thunderfx-stock", "thunderfx-default", "thunderfx-functional", "thunderfx-inductor",
         "thunderfx-inplace", "thunderfx-torchcompile", "thunderfx-gqa-fold", "jit-stock", "jit-inplace", "jit-default")
STOCK_TIMEOUT_S = 1500
# Top-level keys of the JSON, in this order.
RESULT_KEYS = ("benchmark", "timestamp_utc", "mode", "command", "git_rev", "machine", "patched_env", "stock_env",
               "stock_error", "sizes", "elapsed_s", "loadavg_start", "loadavg_end", "other_processes_cores", "rows",
               "table")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _load(name: str, path: Path, *, package: bool = False):
    spec = importlib.util.spec_from_file_location(
        name, path / "__init__.py" if package else path, submodule_search_locations=[str(path)] if package else None)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look the module up while the file executes
    spec.loader.exec_module(mod)
    return mod


# ----------------------------------------------------------------------------------------------------
# Stock side (child process)
# ----------------------------------------------------------------------------------------------------


def stock_worker(spec_path: str, out_path: str) -> int:
    """Runs under scripts/python-stock: the spec's backends with the pristine Thunder, rows as JSON."""
    spec = json.loads(Path(spec_path).read_text())
    warnings.filterwarnings("ignore")
    import thunder.examine
    import torch

    thunder.examine.full_size_copies = _load("thunder.examine.full_size_copies", Path(spec["full_size_copies"]))
    bench = _load("inplace_writes_bench", Path(spec["package"]), package=True)
    report = sys.modules["inplace_writes_bench.report"]
    config = bench.RunConfig(**spec["config"])
    result = {"rows": [], "env": report.env_info(bench.Backends(torch.device(config.device)))}
    out = Path(out_path)
    out.write_text(json.dumps(result))
    reported_as = {v: k for k, v in STOCK.items()}

    def emit(row):
        row.backend, row.process = reported_as.get(row.backend, row.backend), "stock"
        report.progress(row)
        result["rows"].append(row.to_json())
        out.write_text(json.dumps(result))  # what is done survives a crash or a timeout

    bench.run(config, spec["backends"], emit, tag="stock")
    return 0


def run_stock_child(bench, config, backends: list[str], stock_python: str) -> tuple[list[dict], dict | None, str | None]:
    """Run ``backends`` (package names) under the pristine Thunder. Returns (rows, env, error)."""
    import thunder.examine.full_size_copies as fsc

    if not Path(stock_python).exists():
        return [], None, f"{stock_python} not found (pass --stock-python)"
    spec = {"config": dataclasses.asdict(config), "backends": backends, "package": str(Path(bench.__file__).parent),
            "full_size_copies": fsc.__file__}
    with tempfile.TemporaryDirectory(prefix="inplace_writes_") as tmp:
        spec_path, out_path = Path(tmp) / "spec.json", Path(tmp) / "out.json"
        spec_path.write_text(json.dumps(spec))
        # -P: keep scripts/ off the front of sys.path.
        cmd = [stock_python, "-P", str(Path(__file__).resolve()), "--stock-worker", str(spec_path), str(out_path)]
        error = None
        try:
            proc = subprocess.run(cmd, stdout=sys.stderr, timeout=STOCK_TIMEOUT_S)
            if proc.returncode != 0:
                error = f"stock worker exited with status {proc.returncode}"
        except subprocess.TimeoutExpired:
            error = f"stock worker timed out after {STOCK_TIMEOUT_S} s"
        except OSError as e:
            error = f"stock worker could not start: {type(e).__name__}: {e}"
        try:
            data = json.loads(out_path.read_text())
        except (OSError, ValueError):
            data = {"rows": [], "env": None}
    return data["rows"], data["env"], error


# ----------------------------------------------------------------------------------------------------
# The machine: other processes' CPU use, git revision, paths
# ----------------------------------------------------------------------------------------------------


def _busy_cpu_s() -> float | None:
    """CPU seconds all processes of the machine have used since boot (Linux ``/proc/stat``)."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
        user, nice, system, idle, iowait, irq, softirq, steal = (int(x) for x in fields[:8])
        return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def _own_cpu_s() -> float:
    """CPU seconds of this process and its descendants, finished or live."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    total = me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime
    # Live descendants (e.g. Inductor's compile workers) are not in RUSAGE_CHILDREN yet.
    try:
        stats = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                with contextlib.suppress(OSError, ValueError, IndexError):
                    fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
                    stats[int(entry)] = (int(fields[1]), sum(int(x) for x in fields[11:15]))
        tick = os.sysconf("SC_CLK_TCK")
        frontier, seen = [os.getpid()], set()
        while frontier:
            parent = frontier.pop()
            for pid, (ppid, ticks) in stats.items():
                if ppid == parent and pid not in seen:
                    seen.add(pid)
                    frontier.append(pid)
                    total += ticks / tick
    except OSError:
        pass
    return total


class OtherProcesses:
    """Cores used by other processes between construction and :meth:`cores`: ``/proc/stat`` minus this
    process and its children."""

    def __init__(self):
        self.loadavg_start = _loadavg()
        self.busy, self.own, self.t0 = _busy_cpu_s(), _own_cpu_s(), time.perf_counter()

    def cores(self) -> float | None:
        busy = _busy_cpu_s()
        if self.busy is None or busy is None:
            return None
        elapsed = max(time.perf_counter() - self.t0, 1e-9)
        return max(0.0, (busy - self.busy) - (_own_cpu_s() - self.own)) / elapsed


def _loadavg() -> tuple[float, float, float] | None:
    try:
        return os.getloadavg()
    except OSError:
        return None


def git_revision() -> str | None:
    """HEAD, with ``-dirty`` if tracked or untracked (not ignored) files differ from it. ``results/``
    is left out: it is this script's output, not an input."""
    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=20)
        status = subprocess.run(["git", "status", "--porcelain", "--", ".", ":(exclude)results"], cwd=ROOT,
                                capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    if rev.returncode != 0 or status.returncode != 0:
        return None
    return rev.stdout.strip() + ("-dirty" if status.stdout.strip() else "")


def repo_relative(obj):
    """``obj`` (JSON data) with absolute paths into this repository made relative to it."""
    if isinstance(obj, str):
        for root in {str(ROOT), os.path.realpath(ROOT)}:
            obj = obj.replace(root + os.sep, "")
            if obj == root:
                obj = "."
        return obj
    if isinstance(obj, dict):
        return {k: repo_relative(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [repo_relative(v) for v in obj]
    return obj


# ----------------------------------------------------------------------------------------------------
# Driver
# ----------------------------------------------------------------------------------------------------


def main(argv: list[str]) -> int:
    if argv[:1] == ["--stock-worker"]:
        return stock_worker(*argv[1:3])

    import thunder.benchmarks.inplace_writes as bench
    from thunder.benchmarks.inplace_writes import report

    parser = bench.build_parser(prog="scripts/bench.py")
    parser.description = "make bench: " + parser.description + " Stock Thunder in a child process."
    parser.add_argument("--no-stock", action="store_true", help="skip the stock-Thunder child process")
    parser.add_argument("--stock-python", default=str(ROOT / "scripts" / "python-stock"),
                        help="interpreter with the pristine Thunder (default: scripts/python-stock)")
    args = bench.parse_args(argv, parser, (*bench.BACKEND_ORDER, "jit", *STOCK))
    warnings.filterwarnings("ignore")
    t_start = time.perf_counter()
    others = OtherProcesses()
    git_rev = git_revision()
    config = bench.config_from_args(args)
    log(bench.cli.describe(config))

    rows = []
    stock_keys = [k for k in STOCK if not args.no_stock and (not args.backends or k in args.backends)]
    stock_env = stock_error = None
    if stock_keys:
        log("stock Thunder (child process through scripts/python-stock):")
        t0 = time.perf_counter()
        stock_rows, stock_env, stock_error = run_stock_child(bench, config, [STOCK[k] for k in stock_keys],
                                                             args.stock_python)
        rows += [bench.Row.from_json(r) for r in stock_rows]
        log(f"stock child: {len(stock_rows)} results in {time.perf_counter() - t0:.1f} s"
            + (f"; {stock_error}" if stock_error else ""))
        if stock_error and not stock_rows:
            rows += [bench.Row(w, n, k, status="error", error=stock_error, process="stock")
                     for w in config.workloads for n in config.sizes[w] for k in stock_keys]

    def emit(row):
        row.process = "patched"
        report.progress(row)
        rows.append(row)

    patched_keys = None if not args.backends else [b for b in args.backends if b not in STOCK]
    backends = bench.run(config, patched_keys, emit, tag="patched")

    rows = report.sort_rows(rows, ORDER)
    report.add_ratios(rows)
    table = report.format_table(rows)
    cores = others.cores()
    if cores is not None:
        table += f"\n  Other processes used {cores:.2f} of {os.cpu_count() or 1} cores on average during this run."
        if cores > 0.25:
            table += ("\n  WARNING: the machine was busy; other processes inflate and scatter the times "
                      "(OpenMP kernels suffer most when threads outnumber free cores).")
    print(table)
    result = bench.result_dict(
        config, rows, table, time.perf_counter() - t_start, git_rev=git_rev, patched_env=report.env_info(backends),
        stock_env=stock_env, stock_error=stock_error, loadavg_start=others.loadavg_start, loadavg_end=_loadavg(),
        other_processes_cores=cores)
    result = repo_relative({k: result[k] for k in RESULT_KEYS})
    report.write_results(result, rows, Path(args.out), ORDER)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
