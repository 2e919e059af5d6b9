"""Command line and driver: every workload and size, every backend, one row each."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from . import report
from .backends import BACKEND_ORDER, Backends
from .measure import Row, Timer, free_memory, log, measure
from .workloads import WORKLOAD_ALIASES, WORKLOAD_ORDER, WORKLOADS

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence


@dataclasses.dataclass
class RunConfig:
    workloads: list[str]
    sizes: dict[str, list[int]]
    device: str
    quick: bool = False
    threads: int | None = None  # torch.set_num_threads


def run(config: RunConfig, backends: list[str] | None, emit: Callable[[Row], None], tag: str = "") -> Backends:
    """Measure ``backends`` (``None``: every backend of this build, see :meth:`Backends.resolve`) on
    every workload and size of ``config``; ``emit`` receives each row as it is measured."""
    if config.threads:
        torch.set_num_threads(config.threads)
    device = torch.device(config.device)
    factory = Backends(device)
    keys = factory.resolve(backends)
    timer = Timer(device)
    torch.manual_seed(0)
    for name in config.workloads:
        workload = WORKLOADS[name]
        cfg = workload.rep_config(config.quick)
        wkeys = [k for k in keys if workload.runs(k, config.quick)]
        if not wkeys:
            continue
        for n in config.sizes[name]:
            log(f"{f'[{tag}] ' if tag else ''}{workload.title}: size {n:,} ({', '.join(wkeys)})")
            t0 = time.perf_counter()
            case = workload.case(n, device, cfg.max_steps(workload.case.check_after))
            for key in wkeys:
                why = workload.not_run_reason(key)
                if why is None:
                    emit(measure(case, factory, key, cfg, timer))
                else:
                    emit(Row(name, n, key, size_note=case.size_note, status="n/a", error=why))
            del case
            free_memory(device)
            log(f"  ... {time.perf_counter() - t0:.1f} s")
    return factory


def build_parser(prog: str = "python -m thunder.benchmarks.inplace_writes") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description="In-place indexed KV-cache writes: eager, Inductor, "
        "ThunderFX (per inplace_indexed_writes policy) and thunder.jit.",
    )
    p.add_argument("--quick", action="store_true", help="small sizes and few repetitions (CI)")
    p.add_argument(
        "--workloads",
        nargs="+",
        default=None,
        help="any of a/setitem, b/token_pool, c/hf_llama, d/gpt_fast, e/hf_qwen3, f/hf_gpt_oss, g/hf_mistral, "
        "h/hf_mixtral, i/hf_qwen3_moe, j/hf_deepseek_v3 (default: all; --quick: a, b, c)",
    )
    p.add_argument(
        "--backends",
        nargs="+",
        default=None,
        help=f"subset of {', '.join(BACKEND_ORDER)} ('jit' = the jit variant of this build); "
        "default: every backend this build has",
    )
    p.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    p.add_argument("--out", default="results", help="directory for the JSON and PNG results (default: results/)")
    p.add_argument("--sizes", nargs="+", type=int, default=None, help="override the sizes of every workload")
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch.set_num_threads (default: torch's default; "
        "Inductor's CPU kernels are tuned to the thread count they were compiled with, and its on-disk "
        "cache may hold kernels built for another)",
    )
    return p


def parse_args(
    argv: Sequence[str], parser: argparse.ArgumentParser, backend_names: Sequence[str] = (*BACKEND_ORDER, "jit")
) -> argparse.Namespace:
    """Parse and normalize: workload aliases to names in report order, comma-separated lists split."""
    args = parser.parse_args(argv)
    if args.workloads:
        names = [part.strip() for w in args.workloads for part in w.split(",") if part.strip()]
        for name in names:
            if name not in WORKLOAD_ALIASES:
                parser.error(f"unknown workload {name!r}")
        args.workloads = [w for w in WORKLOAD_ORDER if w in {WORKLOAD_ALIASES[n] for n in names}]
    else:
        args.workloads = [w for w in WORKLOAD_ORDER if WORKLOADS[w].in_quick or not args.quick]
    if args.backends:
        args.backends = [b for x in args.backends for b in x.split(",") if b]
        for b in args.backends:
            if b not in backend_names:
                parser.error(f"unknown backend {b!r}")
    return args


def config_from_args(args: argparse.Namespace) -> RunConfig:
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    sizes = {
        w: list(args.sizes or (WORKLOADS[w].quick_sizes if args.quick else WORKLOADS[w].sizes)) for w in args.workloads
    }
    return RunConfig(args.workloads, sizes, device, args.quick, args.threads)


def describe(config: RunConfig) -> str:
    return f"inplace_writes benchmark ({'quick' if config.quick else 'full'}) on {config.device}: " + "; ".join(
        f"{w} {config.sizes[w]}" for w in config.workloads
    )


def result_dict(config: RunConfig, rows: list[Row], table: str, elapsed_s: float, **extra: Any) -> dict[str, Any]:
    """What the JSON file holds; ``extra`` goes after the build's description."""
    return {
        "benchmark": report.BENCHMARK,
        "timestamp_utc": report.utc_stamp(),
        "mode": "quick" if config.quick else "full",
        "command": [sys.executable, *sys.argv],
        "machine": report.machine_info(torch.device(config.device)),
        **extra,
        "sizes": config.sizes,
        "elapsed_s": elapsed_s,
        "rows": [r.to_json() for r in rows],
        "table": table,
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv, build_parser())
    warnings.filterwarnings("ignore")
    t_start = time.perf_counter()
    config = config_from_args(args)
    log(describe(config))
    rows: list[Row] = []

    def emit(row: Row) -> None:
        report.progress(row)
        rows.append(row)

    backends = run(config, args.backends, emit)
    rows = report.sort_rows(rows)
    report.add_ratios(rows)
    table = report.format_table(rows)
    print(table)
    result = result_dict(config, rows, table, time.perf_counter() - t_start, env=report.env_info(backends))
    report.write_results(result, rows, Path(args.out))
    return 0
