"""The one measuring loop every workload and backend goes through, and the row it produces."""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import statistics
import sys
import time
import traceback
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from collections.abc import Callable

    from .backends import Backends
    from .workloads import Case

# A call slower than this gets the minimum number of repetitions (and ends the warm-up).
SLOW_CALL_S = 0.2


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def short_error(e: BaseException) -> str:
    msg = " ".join(str(e).split())
    if len(msg) > 160:
        msg = msg[:157] + "..."
    return f"{type(e).__name__}: {msg}"


class Unavailable(Exception):
    """The backend does not exist in this build (e.g. a policy the build rejects)."""


@dataclasses.dataclass(frozen=True)
class RepConfig:
    warmup: int  # calls after the first (compiling) one, before timing; the calls up to the check count
    min_reps: int
    max_reps: int
    budget_s: float  # target time spent in the timed calls of one backend

    def max_steps(self, check_after: int) -> int:
        """Most calls :func:`measure` makes: first + warm-up (at least up to the check) + timed."""
        return max(check_after, 1 + self.warmup) + self.max_reps

    def reps(self, estimate_us: float) -> tuple[int, bool]:
        """Number of timed calls and whether that is fewer than ``max_reps``."""
        if estimate_us / 1e6 > SLOW_CALL_S:
            reps = self.min_reps
        else:
            reps = int(self.budget_s * 1e6 / max(estimate_us, 1.0))
            reps = max(self.min_reps, min(self.max_reps, reps))
        return reps, reps < self.max_reps


@dataclasses.dataclass
class Segments:
    graphs: int  # Dynamo graphs
    thunder: int  # Thunder segments of the ThunderFX split
    inductor: int  # Inductor segments


@dataclasses.dataclass
class Row:
    """One workload, size and backend. Status ``ok``, ``error``, ``unavailable`` (not in this build) or
    ``n/a`` (not run on this workload); the timing fields are set for ``ok`` only."""

    workload: str
    size: int
    backend: str
    size_note: str = ""
    status: str = "ok"
    median_us: float | None = None
    min_us: float | None = None
    max_us: float | None = None
    mean_us: float | None = None
    reps: int | None = None
    first_call_us: float | None = None
    capped: bool | None = None  # fewer than max_reps timed calls
    correct: bool | None = None
    correct_detail: str | None = None
    segments: Segments | None = None  # ThunderFX only
    full_size_copy_bytes: int | None = None  # Thunder backends only
    full_size_copies: list[str] | None = None
    info_error: str | None = None
    error: str | None = None
    traceback: str | None = None
    process: str | None = None  # set by whoever merges rows of several processes
    vs_eager: float | None = None  # set by report.add_ratios
    vs_inductor: float | None = None

    @property
    def slow(self) -> bool:
        """Repetitions were capped because a call is slow (the table marks those)."""
        return bool(self.capped) and self.median_us is not None and self.median_us / 1e6 > SLOW_CALL_S

    def set_times(self, times_us: list[float]) -> None:
        self.median_us = statistics.median(times_us)
        self.min_us = min(times_us)
        self.max_us = max(times_us)
        self.mean_us = statistics.fmean(times_us)
        self.reps = len(times_us)

    def fail(self, error: Exception) -> None:
        """Keep a backend that is unavailable or fails in the report, with the reason."""
        if isinstance(error, Unavailable):
            self.status, self.error = "unavailable", str(error)
        else:
            self.status, self.error = "error", short_error(error)
            self.traceback = traceback.format_exc()[-2000:]

    def to_json(self) -> dict[str, Any]:
        """The fields that are set (``None`` fields are left out)."""
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Row:
        d = dict(d)
        if d.get("segments") is not None:
            d["segments"] = Segments(**d["segments"])
        return cls(**d)


class Timer:
    """Wall time of one call in microseconds, and its result: CUDA events between synchronizations on
    CUDA, ``perf_counter_ns`` on CPU."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def __call__(self, fn: Callable, *args) -> tuple[float, Any]:
        if self.cuda:
            torch.cuda.synchronize()
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            out = fn(*args)
            end.record()
            torch.cuda.synchronize()
            return start.elapsed_time(end) * 1e3, out
        t0 = time.perf_counter_ns()
        out = fn(*args)
        return (time.perf_counter_ns() - t0) / 1e3, out


def free_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def measure(case: Case, backends: Backends, key: str, cfg: RepConfig, timer: Timer) -> Row:
    """Compile ``case.fn`` with backend ``key`` and measure it on a fresh copy of the case's state.

    Call 0 compiles and is reported as the first call. Calls continue, untimed for the statistics, until
    ``case.check_after`` calls have run (then the result is checked against eager) and ``cfg.warmup``
    calls followed the first one, or a call was slow. Their fastest time picks the number of timed calls.
    Cases whose result must still be right after the timed calls are checked again at the end.
    """
    row = Row(case.workload, case.size, key, size_note=case.size_note)
    state = compiled = None
    try:
        state = case.fresh()
        compiled = backends.compile(key, case.fn, dynamic=case.dynamic)
        calls = 0

        def call() -> float:
            nonlocal calls
            us, out = timer(case.call, compiled.fn, state, calls)
            case.after_call(state, calls, out)
            calls += 1
            return us

        with torch.no_grad() if case.no_grad else contextlib.nullcontext():
            first_us = call()
            warm: list[float] = []
            correct = None
            while True:
                if calls == case.check_after:
                    correct = case.check(state)
                if calls >= case.check_after and (len(warm) >= cfg.warmup or (warm and warm[-1] / 1e6 > SLOW_CALL_S)):
                    break
                warm.append(call())
            reps, row.capped = cfg.reps(min(warm) if warm else first_us)
            times = [call() for _ in range(reps)]
            if case.check_again_at_end and correct[0]:
                correct = case.check(state)
        row.set_times(times)
        row.first_call_us = first_us
        row.correct, row.correct_detail = correct
        info = backends.trace_info(compiled)
        for field in dataclasses.fields(info):
            setattr(row, field.name, getattr(info, field.name))
    except Exception as e:
        row.fail(e)
    finally:
        state = compiled = None
        torch._dynamo.reset()
        free_memory(backends.device)
    return row
