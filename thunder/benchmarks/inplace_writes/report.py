"""Rows to a terminal table, a JSON file and a plot; what machine and build they were measured on."""

from __future__ import annotations

import contextlib
import datetime
import json
import math
import os
import platform
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from .backends import BACKEND_ORDER
from .measure import SLOW_CALL_S, Row, log, short_error
from .workloads import WORKLOAD_ORDER, WORKLOADS

if TYPE_CHECKING:
    from collections.abc import Sequence

    from .backends import Backends

BENCHMARK = "thunder.benchmarks.inplace_writes"


def fmt_time(us: float | None) -> str:
    if us is None or math.isnan(us):
        return "-"
    if us < 1e3:
        return f"{us:.1f} us"
    if us < 1e6:
        return f"{us / 1e3:.2f} ms"
    return f"{us / 1e6:.2f} s"


def fmt_bytes(b: int | None) -> str:
    if b is None:
        return "-"
    if b == 0:
        return "0"
    for unit, div in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if b >= div:
            return f"{b / div:.2f} {unit}"
    return f"{b} B"


def fmt_ratio(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.1f}x" if x < 100 else f"{x:,.0f}x"


def progress(row: Row) -> None:
    """One line to stderr as each row is measured."""
    if row.status == "ok":
        cap = f" (reps capped to {row.reps}: a call takes ~{row.median_us / 1e3:,.0f} ms)" if row.slow else ""
        log(
            f"  {row.backend:<22} median {fmt_time(row.median_us):>10}  first call "
            f"{fmt_time(row.first_call_us)}  {row.correct_detail or ''}{cap}"
        )
    else:
        log(f"  {row.backend:<22} {row.status}: {row.error or ''}")


def add_ratios(rows: list[Row]) -> None:
    """``vs_eager`` and ``vs_inductor``: median over the median of eager / Inductor on the same case."""
    by_case: dict[tuple[str, int], dict[str, float]] = {}
    for r in rows:
        if r.status == "ok":
            by_case.setdefault((r.workload, r.size), {})[r.backend] = r.median_us
    for r in rows:
        if r.status == "ok":
            case = by_case[(r.workload, r.size)]
            r.vs_eager = r.median_us / case["eager"] if "eager" in case else None
            r.vs_inductor = r.median_us / case["inductor"] if "inductor" in case else None


def sort_rows(rows: list[Row], order: Sequence[str] = BACKEND_ORDER) -> list[Row]:
    def key(r: Row):
        return WORKLOAD_ORDER.index(r.workload), r.size, order.index(r.backend) if r.backend in order else len(order)

    return sorted(rows, key=key)


HEADERS = [
    "backend",
    "median",
    "min",
    "max",
    "reps",
    "/eager",
    "/inductor",
    "segs T+I",
    "full copies/call",
    "first call",
    "correct",
]


def _cells(r: Row) -> list[str]:
    seg = r.segments
    segs = "-" if seg is None else f"{seg.thunder}+{seg.inductor}" + (f" ({seg.graphs}g)" if seg.graphs != 1 else "")
    corr = r.correct_detail or ""
    if not r.correct:
        corr = "FAIL " + corr
    return [
        r.backend,
        fmt_time(r.median_us),
        fmt_time(r.min_us),
        fmt_time(r.max_us),
        f"{r.reps}{'*' if r.slow else ''}",
        fmt_ratio(r.vs_eager),
        fmt_ratio(r.vs_inductor),
        segs,
        fmt_bytes(r.full_size_copy_bytes),
        fmt_time(r.first_call_us),
        corr,
    ]


def format_table(rows: list[Row]) -> str:
    """Rows in the order given, one block per workload and size."""
    lines = []
    for workload in WORKLOAD_ORDER:
        wrows = [r for r in rows if r.workload == workload]
        if not wrows:
            continue
        lines += ["", WORKLOADS[workload].title]
        for size in sorted({r.size for r in wrows}):
            srows = [r for r in wrows if r.size == size]
            lines.append(f"  N = {size:,} ({srows[0].size_note})")
            table = [_cells(r) for r in srows if r.status == "ok"]
            widths = [max([len(h), *(len(t[i]) for t in table)]) for i, h in enumerate(HEADERS)]

            def fmt_row(cells):
                last = len(HEADERS) - 1
                return "    " + "  ".join(
                    c.ljust(w) if i in (0, last) else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))
                )

            lines.append(fmt_row(HEADERS))
            for r in srows:
                if r.status == "ok":
                    lines.append(fmt_row(_cells(r)))
                else:
                    lines.append(f"    {r.backend.ljust(widths[0])}  {r.status.upper()}: {r.error or ''}")
    lines += [
        "",
        "  times per call (a) or per decode step (b-j); /eager, /inductor: median ratio in this run;",
        "  segs T+I: Thunder + Inductor segments of the ThunderFX split ('g': Dynamo graphs);",
        "  full copies/call: bytes of full-size copies of inputs in the Thunder execution traces;",
        f"  reps*: repetitions capped because a call takes > {SLOW_CALL_S} s.",
    ]
    return "\n".join(lines)


def plot(rows: list[Row], path: Path, title: str, order: Sequence[str] = BACKEND_ORDER) -> bool:
    """Time against size, log-log, one panel per workload measured at several sizes (the cache-write
    ones), one line per backend (dashed where the traces copy whole inputs)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:
        log(f"no plot: {short_error(e)}")
        return False
    ok = [r for r in rows if r.status == "ok"]
    panels = [w for w in WORKLOAD_ORDER if WORKLOADS[w].plotted and len({r.size for r in ok if r.workload == w}) > 1]
    if not panels:
        return False
    backends = sorted({r.backend for r in ok}, key=lambda b: order.index(b) if b in order else len(order))
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 5), squeeze=False)
    markers = "osD^v<>ph*"
    for ax, workload in zip(axes[0], panels):
        for j, backend in enumerate(backends):
            pts = sorted((r for r in ok if r.workload == workload and r.backend == backend), key=lambda r: r.size)
            if not pts:
                continue
            copies = any(r.full_size_copy_bytes for r in pts)
            ax.errorbar(
                [r.size for r in pts],
                [r.median_us for r in pts],
                yerr=[[r.median_us - r.min_us for r in pts], [r.max_us - r.median_us for r in pts]],
                marker=markers[j % len(markers)],
                capsize=3,
                label=backend,
                linestyle="--" if copies else "-",
            )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("N (rows in the cache)")
        ax.set_ylabel("time per call / step (us), median, min-max")
        ax.set_title(WORKLOADS[workload].title, fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def machine_info(device: torch.device) -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem = None
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                mem = int(line.split()[1]) * 1024
    info = {
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "memory_bytes": mem,
        "platform": platform.platform(),
        "device": str(device),
    }
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def env_info(backends: Backends) -> dict[str, Any]:
    """Versions of the measured build, and the ThunderFX policies it accepts (``None``: no option)."""
    info: dict[str, Any] = {"torch": torch.__version__, "python": platform.python_version()}
    try:
        import thunder

        info["thunder"] = getattr(thunder, "__version__", "?")
        info["thunder_path"] = str(Path(thunder.__file__).resolve().parent)
    except Exception as e:
        info["thunder"] = short_error(e)
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except Exception:
        info["transformers"] = None
    try:
        info["thunderfx_policies"] = list(backends.fx_policies()) or None
    except Exception:
        info["thunderfx_policies"] = None
    return info


def utc_stamp() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")


def write_results(result: dict[str, Any], rows: list[Row], out_dir: Path, order: Sequence[str] = BACKEND_ORDER) -> None:
    """``<out>/<stamp>.json`` (``result``) and ``<out>/<stamp>.png``, copied to ``latest.*``."""
    stamp, machine = result["timestamp_utc"], result["machine"]
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / f"{stamp}.json"
    json_path.write_text(json.dumps(result, indent=1, default=str))
    shutil.copyfile(json_path, out_dir / "latest.json")
    png_path = out_dir / f"{stamp}.png"
    title = (
        f"in-place indexed writes, {machine['device']} ({machine['cpu']}, {machine['cpu_count']} cores), "
        f"torch {torch.__version__}, {result['mode']} run {stamp}"
    )
    elapsed = f"elapsed {result['elapsed_s']:.0f} s"
    if plot(rows, png_path, title, order):
        shutil.copyfile(png_path, out_dir / "latest.png")
        print(f"\nwrote {json_path} and {png_path} (+ latest.json, latest.png); {elapsed}")
    else:
        print(f"\nwrote {json_path} (+ latest.json); {elapsed}")
