"""Benchmark of in-place indexed writes into a KV cache: eager, Inductor, stock and patched Thunder.

What and why
------------
A decode step writes one token's keys and values into a preallocated KV cache: ``k_buffer[loc] = k``.
Stock Thunder lowers such an in-place indexed write on a graph input to a functional op plus a copy back,
``b = buf.clone(); b[idx] = v; buf.copy_(b)``: four passes over the whole cache to write one row, so the
cost of a decode step grows with the size of the cache instead of with the size of the write. This
benchmark measures that cost, and what the patch set that fixes it buys, on four workloads:

``a`` / ``setitem``
    The reported graph, ``def write(k_buffer, loc, k): k_buffer[loc] = k`` with a bf16 buffer
    ``[N, 8, 64]``, ``loc`` int64 ``[1]`` and ``k`` ``[1, 8, 64]``, for N = 4,096, 262,144 and 2,615,232.
``b`` / ``token_pool``
    One decode step of a small Llama-style decoder (random weights, 4 layers, 8 query heads, 2 KV heads,
    head_dim 64, hidden 512) whose KV cache is a flat token pool per layer, as in SGLang's
    ``MHATokenToKVPool``: ``k_buffer[layer]`` is ``[N_pool, kv_heads, head_dim]``, each step writes
    ``k_buffer[layer][loc] = k`` (and ``v``) and attends over the request's 128 slots gathered from the
    pool, ``k_buffer[layer][req_slots]``. The write is the only work that grows with ``N_pool``.
``d`` / ``gpt_fast``
    The same decoder with a gpt-fast-style cache ``[1, kv_heads, N, head_dim]`` written with
    ``k_cache[:, :, input_pos] = k`` (one size, ThunderFX backends only: a layout variant of ``b``).
``c`` / ``hf_llama``
    Hugging Face ``LlamaForCausalLM`` (tiny random config, float32) with a ``StaticCache``, which writes
    with ``keys.index_copy_(2, cache_position, k)``; greedy decode steps after an 8-token prefill through
    the compiled model forward. Here attention over the whole static cache grows with the cache too.

Backends, all measured in the same run: eager; ``torch.compile`` with Inductor; ThunderFX
(``torch.compile(backend=thunder.dynamo.ThunderCompiler(...))``) of the *stock* Thunder release, run in a
child process through ``scripts/python-stock`` (same file, ``--worker``); patched ThunderFX with each
``inplace_indexed_writes`` policy this build accepts (``functional`` = stock behaviour, ``inductor`` = the
writes are routed to Inductor, ``inplace`` = Thunder writes in place; a policy the build rejects is
reported as unavailable); ``thunder.jit`` of the stock release and of the patched build (policy
``inplace`` when available) for the plain-function workloads.

For each workload, size and backend the report gives the median, min and max time per call (or decode
step), the ratio to eager and to Inductor, the number of Thunder and Inductor segments ThunderFX split the
graph into, the bytes written per call by full-size copies of inputs that
:func:`thunder.examine.full_size_copies.find_full_size_copies` finds in the Thunder execution traces,
and a correctness check against eager (the cache after the same steps: untouched rows bitwise equal and
written rows equal or allclose; greedy tokens equal for ``c``). A backend that fails is reported with the
error, never dropped.

How to run
----------
::

    make bench                                   # == .venv/bin/python -m thunder.benchmarks.inplace_writes
    make bench ARGS="--quick"                    # a, b, c at small sizes, few repetitions; on b and c no
                                                 # thunder.jit and no patched "functional" policy (the
                                                 # stock row shows that behaviour); < 2 min on 2 CPU cores
    python -m thunder.benchmarks.inplace_writes --workloads a b --device cpu --out results/

It writes a table to the terminal, ``<out>/<UTC timestamp>.json`` (machine, versions, git revision, command
line, all numbers) and ``<out>/<UTC timestamp>.png`` (time against size, log-log, one line per backend),
both also copied to ``<out>/latest.json`` and ``<out>/latest.png``. On a machine with a GPU the default
device is CUDA and calls are timed with CUDA events between ``torch.cuda.synchronize()`` calls; on CPU
with ``time.perf_counter_ns``. Calls slower than about 0.2 s get fewer repetitions (at least 3); the
table marks those with ``*``. Each backend starts from the same cache contents and is compiled (and run
once) before it is timed; the first call's time is reported separately.

The full run takes about 7-8 minutes on 2 CPU cores and peaks at about 9 GB of memory (the 4 GiB token
pool, eager's reference copy of it, and the functional path's transient copies). CPU timings are very
sensitive to other processes on the machine (OpenMP threads of the two processes compete for cores); the
report ends with how many cores other processes used during the run and warns when that was noticeable.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import gc
import importlib.util
import inspect
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path

import torch

__all__ = ["main"]

WORKLOAD_ALIASES = {
    "a": "setitem",
    "setitem": "setitem",
    "b": "token_pool",
    "token_pool": "token_pool",
    "c": "hf_llama",
    "hf_llama": "hf_llama",
    "hf": "hf_llama",
    "d": "gpt_fast",
    "gpt_fast": "gpt_fast",
}
WORKLOAD_ORDER = ("setitem", "token_pool", "gpt_fast", "hf_llama")
WORKLOAD_TITLES = {
    "setitem": "(a) k_buffer[loc] = k, bf16 [N, 8, 64]",
    "token_pool": "(b) token-pool decode step, 4-layer GQA decoder, f32 pool [N_pool, 2, 64] per layer",
    "gpt_fast": "(d) gpt-fast-style decode step, k_cache[:, :, input_pos] = k, f32 [1, 2, N, 64] per layer",
    "hf_llama": "(c) HF LlamaForCausalLM + StaticCache, f32, greedy decode step after 8-token prefill",
}

# Sizes per workload: full mode, quick mode.
SIZES = {
    "setitem": ((4096, 262_144, 2_615_232), (4096, 65_536)),
    "token_pool": ((65_536, 1_048_576), (65_536,)),
    "gpt_fast": ((65_536,), (65_536,)),
    "hf_llama": ((4096, 65_536), (4096,)),
}

# Backend keys in report order. "stock" ones run in the child process with the pristine Thunder.
BACKEND_ORDER = (
    "eager",
    "inductor",
    "thunderfx-stock",
    "thunderfx-functional",
    "thunderfx-inductor",
    "thunderfx-inplace",
    "jit-stock",
    "jit-inplace",
    "jit-default",
)
STOCK_BACKENDS = ("thunderfx-stock", "jit-stock")
PATCHED_BACKENDS = tuple(b for b in BACKEND_ORDER if b not in STOCK_BACKENDS)
FX_POLICIES = ("functional", "inductor", "inplace")

# Backends left out of --quick runs to keep them under two minutes (compilation dominates there).
# The patched "functional" policy is stock behaviour, which the stock ThunderFX row shows.
QUICK_SKIP = {
    "token_pool": ("jit-stock", "jit-default", "jit-inplace", "thunderfx-functional"),
    "hf_llama": ("thunderfx-functional",),
}
# Backends never run on a workload: (d) is a layout variant of (b) for ThunderFX; thunder.jit is run on (b).
SKIP = {"gpt_fast": ("jit-stock", "jit-default", "jit-inplace")}
# Workloads of a --quick run without --workloads.
QUICK_WORKLOADS = ("setitem", "token_pool", "hf_llama")

# A call slower than this gets the minimum number of repetitions.
SLOW_CALL_S = 0.2


@dataclasses.dataclass(frozen=True)
class RepConfig:
    warmup: int  # calls after the first (compiling) one, before timing
    min_reps: int
    max_reps: int
    budget_s: float  # target time spent in the timed calls of one backend


def rep_config(workload: str, quick: bool) -> RepConfig:
    if workload == "setitem":
        return RepConfig(2, 3, 30 if quick else 200, 0.3 if quick else 1.0)
    if workload in ("token_pool", "gpt_fast"):
        return RepConfig(0, 3, 8 if quick else 30, 0.5 if quick else 1.5)
    return RepConfig(1, 3, 6 if quick else 20, 0.5 if quick else 1.5)


class Unavailable(Exception):
    """The backend does not exist in this build (e.g. a policy the build rejects)."""


def record_failure(row: dict, error: Exception) -> None:
    """Keep a backend that is unavailable or fails in the report, with the reason, instead of dropping it."""
    if isinstance(error, Unavailable):
        row.update(status="unavailable", error=str(error))
    else:
        row.update(status="error", error=_short_error(error), traceback=traceback.format_exc()[-2000:])


# ----------------------------------------------------------------------------------------------------
# Helpers: trace inspection, timing, memory
# ----------------------------------------------------------------------------------------------------


def _repo_root() -> Path | None:
    for parent in Path(__file__).resolve().parents:
        if (parent / "scripts" / "patchset.py").is_file():
            return parent
    return None


_FSC = None


def full_size_copies_module():
    """``thunder.examine.full_size_copies``; under the stock release (which lacks it), loaded by path."""
    global _FSC
    if _FSC is not None:
        return _FSC
    try:
        import thunder.examine.full_size_copies as mod
    except ImportError:
        candidates = [Path(__file__).resolve().parents[1] / "examine" / "full_size_copies.py"]
        root = _repo_root()
        if root is not None:
            candidates.append(root / "thunder" / "examine" / "full_size_copies.py")
        path = next((p for p in candidates if p.is_file()), None)
        if path is None:
            raise
        spec = importlib.util.spec_from_file_location("_inplace_writes_full_size_copies", path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod  # dataclasses look the module up while the file executes
        spec.loader.exec_module(mod)
    _FSC = mod
    return mod


def _rss_gib() -> float:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**30
    except OSError:
        return float("nan")


def free_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


class Timer:
    """Wall time of one call in microseconds: CUDA events between synchronizations on CUDA,
    ``perf_counter_ns`` on CPU."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def __call__(self, fn, *args) -> float:
        if self.cuda:
            torch.cuda.synchronize()
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            fn(*args)
            end.record()
            torch.cuda.synchronize()
            return start.elapsed_time(end) * 1e3
        t0 = time.perf_counter_ns()
        fn(*args)
        return (time.perf_counter_ns() - t0) / 1e3


def choose_reps(estimate_us: float, cfg: RepConfig) -> tuple[int, bool]:
    """Number of timed calls and whether that is fewer than ``cfg.max_reps``."""
    if estimate_us / 1e6 > SLOW_CALL_S:
        reps = cfg.min_reps
    else:
        reps = int(cfg.budget_s * 1e6 / max(estimate_us, 1.0))
        reps = max(cfg.min_reps, min(cfg.max_reps, reps))
    return reps, reps < cfg.max_reps


def summarize(times_us: list[float]) -> dict:
    return {
        "median_us": statistics.median(times_us),
        "min_us": min(times_us),
        "max_us": max(times_us),
        "mean_us": statistics.fmean(times_us),
        "reps": len(times_us),
    }


def _short_error(e: BaseException) -> str:
    msg = " ".join(str(e).split())
    if len(msg) > 160:
        msg = msg[:157] + "..."
    return f"{type(e).__name__}: {msg}"


# ----------------------------------------------------------------------------------------------------
# Backends
# ----------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Compiled:
    fn: object
    fx_backend: object = None  # ThunderCompiler
    jit_fn: object = None  # thunder.jit result
    label: str = ""


def _jit_policy_support(device: torch.device) -> tuple[bool, bool]:
    """Whether ``thunder.jit`` validates ``inplace_indexed_writes`` (so rejects an unknown value) and
    whether it accepts ``"inplace"``. ``thunder.jit`` silently accepts unknown compile options, so an
    option is only taken as supported if a bogus value is rejected."""
    import thunder

    def f(b, i, v):
        b[i] = v

    def attempt(policy):
        b = torch.zeros(4, 2, device=device)
        thunder.jit(f, inplace_indexed_writes=policy)(b, torch.tensor([1], device=device), torch.ones(1, 2, device=device))

    try:
        attempt("__no_such_policy__")
    except (ValueError, TypeError):
        validated = True
    except Exception:
        validated = False
    else:
        validated = False
    if not validated:
        return False, False
    try:
        attempt("inplace")
    except Exception:
        return True, False
    return True, True


class BackendFactory:
    def __init__(self, device: torch.device, stock: bool):
        self.device = device
        self.stock = stock
        self._jit_support = None

    def jit_support(self) -> tuple[bool, bool]:
        if self._jit_support is None:
            self._jit_support = _jit_policy_support(self.device)
        return self._jit_support

    def keys(self, wanted: set[str] | None) -> list[str]:
        keys = list(STOCK_BACKENDS if self.stock else PATCHED_BACKENDS)
        if not self.stock:
            # jit-default only when the build has no "inplace" policy for thunder.jit.
            keys.remove("jit-default" if self.jit_support()[1] else "jit-inplace")
        if wanted:
            keys = [k for k in keys if k in wanted or (k.startswith("jit-") and "jit" in wanted)]
        return keys

    def label(self, key: str) -> str:
        return key

    def compile(self, key: str, fn, *, is_module: bool = False) -> Compiled:
        import thunder

        if key == "eager":
            return Compiled(fn)
        if key == "inductor":
            return Compiled(torch.compile(fn, backend="inductor", dynamic=False))
        if key.startswith("thunderfx-"):
            from thunder.dynamo import ThunderCompiler

            if key == "thunderfx-stock":
                backend = ThunderCompiler()
            else:
                policy = key.split("-", 1)[1]
                try:
                    backend = ThunderCompiler(inplace_indexed_writes=policy)
                except (ValueError, TypeError) as e:
                    raise Unavailable(f"unavailable in this build ({_short_error(e)})") from e
            return Compiled(torch.compile(fn, backend=backend, dynamic=False), fx_backend=backend)
        if key == "jit-stock" or key == "jit-default":
            jfn = thunder.jit(fn)
            return Compiled(jfn, jit_fn=jfn)
        if key == "jit-inplace":
            validated, has_inplace = self.jit_support()
            if not has_inplace:
                raise Unavailable("unavailable in this build (thunder.jit has no inplace_indexed_writes='inplace')")
            jfn = thunder.jit(fn, inplace_indexed_writes="inplace")
            return Compiled(jfn, jit_fn=jfn)
        raise ValueError(f"unknown backend {key!r}")


def thunder_info(c: Compiled) -> dict:
    """Segment counts (ThunderFX) and bytes of full-size copies per call in the Thunder traces."""
    info: dict = {}
    try:
        import thunder

        fsc = full_size_copies_module()
        traces = []
        if c.fx_backend is not None:
            b = c.fx_backend
            n_thunder = n_inductor = 0
            for si in b.subgraph_infos:
                n_thunder += len(si.thunder_compiled_fns or [])
                for cf in (si.submodule_to_compiled_functions or {}).values():
                    if getattr(cf.compiler, "name", "") == "TORCH_INDUCTOR":
                        n_inductor += 1
            info["segments"] = {"graphs": len(b.subgraph_infos), "thunder": n_thunder, "inductor": n_inductor}
            traces = fsc.thunderfx_execution_traces(b)
        elif c.jit_fn is not None:
            traces = [thunder.last_traces(c.jit_fn)[-1]]
        if c.fx_backend is not None or c.jit_fn is not None:
            copies = [cp for tr in traces for cp in fsc.find_full_size_copies(tr)]
            info["full_size_copy_bytes"] = sum(cp.nbytes for cp in copies)
            info["full_size_copies"] = [str(cp)[:300] for cp in copies[:16]]
    except Exception as e:  # the numbers are a diagnostic; never fail the benchmark for them
        info["info_error"] = _short_error(e)
    return info


def reset_compilers() -> None:
    torch._dynamo.reset()


# ----------------------------------------------------------------------------------------------------
# Workload (a): the reported graph
# ----------------------------------------------------------------------------------------------------


def write(k_buffer, loc, k):
    k_buffer[loc] = k


def _tiled(shape, dtype, device, gen, tile_rows=4096) -> torch.Tensor:
    """A tensor of ``shape`` filled with a tiled random block: random-looking, cheap for GB-sized buffers."""
    n = shape[0]
    rows = min(n, tile_rows)
    block = torch.randn((rows, *shape[1:]), generator=gen, dtype=torch.float32).to(dtype=dtype, device=device)
    out = torch.empty(shape, dtype=dtype, device=device)
    for start in range(0, n, rows):
        stop = min(n, start + rows)
        out[start:stop] = block[: stop - start]
    return out


def run_setitem(n: int, keys, factory: BackendFactory, cfg: RepConfig, device, emit) -> None:
    gen = torch.Generator().manual_seed(n)
    timer = Timer(device)
    ref = _tiled((n, 8, 64), torch.bfloat16, device, gen)
    loc = torch.tensor([n // 2 + 3], dtype=torch.int64, device=device)
    k = torch.randn((1, 8, 64), generator=gen).to(dtype=torch.bfloat16, device=device)
    saved = ref[loc].clone()
    write(ref, loc, k)  # eager reference result
    size_note = f"{n * 8 * 64 * 2 / 2**20:,.0f} MiB buffer"
    for key in keys:
        row = {"workload": "setitem", "size": n, "size_note": size_note, "backend": key}
        buf = None
        try:
            buf = ref.clone()
            buf[loc] = saved
            c = factory.compile(key, write)
            first_us = timer(c.fn, buf, loc, k)
            ok = torch.equal(buf, ref)
            warm = []
            for _ in range(cfg.warmup):
                warm.append(timer(c.fn, buf, loc, k))
                if warm[-1] > SLOW_CALL_S * 1e6:  # slow calls: one warm-up is enough
                    break
            reps, capped = choose_reps(min(warm) if warm else first_us, cfg)
            times = [timer(c.fn, buf, loc, k) for _ in range(reps)]
            ok_after = torch.equal(buf, ref)
            row.update(summarize(times), status="ok", first_call_us=first_us, capped=capped)
            row["correct"] = ok and ok_after
            row["correct_detail"] = "bitwise equal" if (ok and ok_after) else "buffer differs from eager"
            row.update(thunder_info(c))
        except Exception as e:
            record_failure(row, e)
        finally:
            c = None
            buf = None
            reset_compilers()
            free_memory(device)
        emit(row)
    del ref
    free_memory(device)


# ----------------------------------------------------------------------------------------------------
# Workloads (b) and (d): a small decoder with a token-pool (or gpt-fast-style) KV cache
# ----------------------------------------------------------------------------------------------------


class RMSNorm(torch.nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class DecoderLayer(torch.nn.Module):
    def __init__(self, hidden, n_heads, n_kv_heads, head_dim, intermediate):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, head_dim
        self.attn_norm = RMSNorm(hidden)
        self.wq = torch.nn.Linear(hidden, n_heads * head_dim, bias=False)
        self.wk = torch.nn.Linear(hidden, n_kv_heads * head_dim, bias=False)
        self.wv = torch.nn.Linear(hidden, n_kv_heads * head_dim, bias=False)
        self.wo = torch.nn.Linear(n_heads * head_dim, hidden, bias=False)
        self.mlp_norm = RMSNorm(hidden)
        self.w1 = torch.nn.Linear(hidden, intermediate, bias=False)
        self.w3 = torch.nn.Linear(hidden, intermediate, bias=False)
        self.w2 = torch.nn.Linear(intermediate, hidden, bias=False)


def _rope(x, cos, sin):
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class PoolDecoder(torch.nn.Module):
    """Llama-style decoder, batch 1, one token per step. ``layout="token_pool"``: per-layer caches
    ``[N, kv_heads, head_dim]`` written with ``k_buffer[layer][loc] = k`` (SGLang's token pool);
    ``layout="gpt_fast"``: ``[1, kv_heads, N, head_dim]`` written with ``k_cache[:, :, loc] = k``.
    Attention reads only the request's slots ``req_slots``, gathered from the cache after the write."""

    def __init__(self, layout="token_pool", vocab=1000, hidden=512, n_layers=4, n_heads=8, n_kv_heads=2,
                 head_dim=64, intermediate=1408):
        super().__init__()
        self.layout = layout
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, head_dim
        self.embed = torch.nn.Embedding(vocab, hidden)
        self.layers = torch.nn.ModuleList(
            DecoderLayer(hidden, n_heads, n_kv_heads, head_dim, intermediate) for _ in range(n_layers)
        )
        self.norm = RMSNorm(hidden)
        self.lm_head = torch.nn.Linear(hidden, vocab, bias=False)
        self.register_buffer("inv_freq", 1.0 / (10000.0 ** (torch.arange(0, head_dim, 2).float() / head_dim)),
                             persistent=False)

    def forward(self, token, pos, k_buffer: list, v_buffer: list, loc, req_slots):
        H, KV, D = self.n_heads, self.n_kv_heads, self.head_dim
        x = self.embed(token)  # [1, hidden]
        freqs = pos.to(torch.float32)[:, None] * self.inv_freq[None, :]  # [1, D/2]
        cos, sin = freqs.cos()[:, None, :], freqs.sin()[:, None, :]  # [1, 1, D/2]
        for i, layer in enumerate(self.layers):
            h = layer.attn_norm(x)
            q = _rope(layer.wq(h).view(1, H, D), cos, sin)
            k = _rope(layer.wk(h).view(1, KV, D), cos, sin)
            v = layer.wv(h).view(1, KV, D)
            if self.layout == "token_pool":
                k_buffer[i][loc] = k
                v_buffer[i][loc] = v
                ks = k_buffer[i][req_slots].transpose(0, 1)  # [KV, L, D]
                vs = v_buffer[i][req_slots].transpose(0, 1)
            else:
                k_buffer[i][:, :, loc] = k.view(1, KV, 1, D)
                v_buffer[i][:, :, loc] = v.view(1, KV, 1, D)
                ks = k_buffer[i][:, :, req_slots][0]  # [KV, L, D]
                vs = v_buffer[i][:, :, req_slots][0]
            qg = q.view(KV, H // KV, D)
            scores = torch.matmul(qg, ks.transpose(-1, -2)) * (D**-0.5)  # [KV, G, L]
            probs = torch.softmax(scores, dim=-1)
            o = torch.matmul(probs, vs).reshape(1, H * D)
            x = x + layer.wo(o)
            h = layer.mlp_norm(x)
            x = x + layer.w2(torch.nn.functional.silu(layer.w1(h)) * layer.w3(h))
        return self.lm_head(self.norm(x))


POOL_CONTEXT = 1000  # positions already in the cache before the first measured step
POOL_WINDOW = 128  # slots each step attends over


def run_pool(workload: str, n: int, keys, factory: BackendFactory, cfg: RepConfig, device, emit):
    layout = workload
    torch.manual_seed(0)
    model = PoolDecoder(layout=layout).to(device).eval().requires_grad_(False)
    L, KV, D = len(model.layers), model.n_kv_heads, model.head_dim
    gen = torch.Generator().manual_seed(n + 1)
    timer = Timer(device)
    n_check = 3  # steps compared against eager: the first compiles, the later ones read what it wrote
    n_steps = n_check + cfg.warmup + cfg.max_reps
    # A request's token positions live at random slots of the pool.
    slot_of_pos = torch.randperm(n, generator=gen)[: POOL_CONTEXT + n_steps].to(device)
    tokens = torch.randint(0, 1000, (n_steps, 1), generator=gen).to(device)

    def step_inputs(t):
        p = POOL_CONTEXT + t
        # Separate tensors, not views of one: Thunder rejects inputs that alias each other with
        # different shapes (insert_alias_updates tries to reshape one into the other).
        return (tokens[t].clone(), torch.tensor([p], device=device), slot_of_pos[p : p + 1].clone(),
                slot_of_pos[p - POOL_WINDOW + 1 : p + 1].clone())

    inputs = [step_inputs(t) for t in range(n_steps)]
    slot_dim = 0 if layout == "token_pool" else 2
    shape = (n, KV, D) if layout == "token_pool" else (1, KV, n, D)

    def make_cache():
        if layout == "token_pool":
            return [_tiled(shape, torch.float32, device, gen) for _ in range(L)]
        return [_tiled((n, KV, D), torch.float32, device, gen).permute(1, 0, 2).contiguous()[None] for _ in range(L)]

    ref_k, ref_v = make_cache(), make_cache()
    written = slot_of_pos[POOL_CONTEXT : POOL_CONTEXT + n_check]
    saved_k = [b.index_select(slot_dim, written) for b in ref_k]
    saved_v = [b.index_select(slot_dim, written) for b in ref_v]
    ref_logits = []
    with torch.no_grad():
        for t in range(n_check):
            tok, pos, loc, req = inputs[t]
            ref_logits.append(model(tok, pos, ref_k, ref_v, loc, req))
    pool_bytes = 2 * L * n * KV * D * 4
    size_note = f"{pool_bytes / 2**30:.2f} GiB k+v cache ({L} layers)"
    log(f"  [{workload} N={n:,}] cache {size_note}; process RSS {_rss_gib():.1f} GiB")

    def fresh(ref, saved):
        out = [b.clone() for b in ref]
        for b, s in zip(out, saved):
            b.index_copy_(slot_dim, written, s)
        return out

    def compare(bufs, refs) -> tuple[bool, float]:
        """(untouched slots bitwise equal, max |diff| over the written slots)."""
        untouched_ok, max_diff = True, 0.0
        for b, r in zip(bufs, refs):
            got = b.index_select(slot_dim, written)
            want = r.index_select(slot_dim, written)
            b.index_copy_(slot_dim, written, want)
            untouched_ok &= torch.equal(b, r)
            b.index_copy_(slot_dim, written, got)
            max_diff = max(max_diff, (got - want).abs().max().item())
        return untouched_ok, max_diff

    for key in keys:
        row = {"workload": workload, "size": n, "size_note": size_note, "backend": key}
        kb = vb = c = None
        try:
            kb, vb = fresh(ref_k, saved_k), fresh(ref_v, saved_v)
            c = factory.compile(key, model, is_module=True)
            logits = []
            step_us = []

            def step(t):
                tok, pos, loc, req = inputs[t]
                logits.append(c.fn(tok, pos, kb, vb, loc, req))

            with torch.no_grad():
                for t in range(n_check):
                    step_us.append(timer(step, t))
                untouched_ok_k, dk = compare(kb, ref_k)
                untouched_ok_v, dv = compare(vb, ref_v)
                dl = max((a - b).abs().max().item() for a, b in zip(logits, ref_logits))
                same_tokens = all(torch.equal(a.argmax(-1), b.argmax(-1)) for a, b in zip(logits, ref_logits))
                warm = [timer(step, n_check + i) for i in range(cfg.warmup)]
                reps, capped = choose_reps(min(step_us[1:] + warm), cfg)
                base = n_check + cfg.warmup
                times = [timer(step, base + i) for i in range(reps)]
            untouched_ok = untouched_ok_k and untouched_ok_v
            max_diff = max(dk, dv)
            if untouched_ok and max_diff == 0.0 and dl == 0.0:
                detail, ok = "bitwise equal", True
            elif untouched_ok and max_diff <= 1e-4 and dl <= 1e-3 and same_tokens:
                detail, ok = f"allclose (written rows max|d|={max_diff:.1e}, logits {dl:.1e})", True
            else:
                detail = (f"WRONG: untouched slots {'equal' if untouched_ok else 'CHANGED'}, written rows "
                          f"max|d|={max_diff:.2e}, logits max|d|={dl:.2e}, argmax {'same' if same_tokens else 'differs'}")
                ok = False
            row.update(summarize(times), status="ok", first_call_us=step_us[0], capped=capped,
                       correct=ok, correct_detail=detail)
            row.update(thunder_info(c))
        except Exception as e:
            record_failure(row, e)
        finally:
            kb = vb = c = logits = None
            reset_compilers()
            free_memory(device)
        emit(row)
    del ref_k, ref_v, model
    free_memory(device)


# ----------------------------------------------------------------------------------------------------
# Workload (c): Hugging Face LlamaForCausalLM + StaticCache
# ----------------------------------------------------------------------------------------------------

HF_PROMPT = 8
HF_CHECK_STEPS = 6


def run_hf(max_cache_len: int, keys, factory: BackendFactory, cfg: RepConfig, device, emit):
    from transformers import LlamaConfig, LlamaForCausalLM, StaticCache

    config = LlamaConfig(vocab_size=1000, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(device=device, dtype=torch.float32).eval().requires_grad_(False)
    prompt = torch.randint(0, config.vocab_size, (1, HF_PROMPT), generator=torch.Generator().manual_seed(1)).to(device)
    timer = Timer(device)
    cache_bytes = 2 * config.num_hidden_layers * config.num_key_value_heads * max_cache_len * (
        config.hidden_size // config.num_attention_heads) * 4
    size_note = f"{cache_bytes / 2**20:,.0f} MiB StaticCache"

    def decode(fn, n_steps, step_us=None, cfg=None):
        """Eager prefill, then greedy decode steps through ``fn``. With ``cfg``, the number of steps is
        chosen after the first ``1 + cfg.warmup + 1`` (compile, warm-up, estimate) steps."""
        cache = StaticCache(config=model.config, max_cache_len=max_cache_len)
        with torch.no_grad():
            out = model(input_ids=prompt, past_key_values=cache, use_cache=True,
                        cache_position=torch.arange(HF_PROMPT, device=device))
            tok = out.logits[:, -1:].argmax(-1)
            toks = [tok.item()]
            s = 0
            while s < n_steps:
                pos = torch.tensor([HF_PROMPT + s], device=device)
                holder = []

                def step():
                    holder.append(fn(input_ids=tok, past_key_values=cache, use_cache=True, cache_position=pos))

                us = timer(step)
                if step_us is not None:
                    step_us.append(us)
                tok = holder[0].logits[:, -1:].argmax(-1)
                toks.append(tok.item())
                s += 1
                if cfg is not None and s == 2 + cfg.warmup:
                    reps, capped = choose_reps(min(step_us[1:]), cfg)
                    decode.reps, decode.capped = reps, capped
                    n_steps = max(HF_CHECK_STEPS, s + reps)
        return toks

    ref_tokens = decode(model, HF_CHECK_STEPS)
    for key in keys:
        row = {"workload": "hf_llama", "size": max_cache_len, "size_note": size_note, "backend": key}
        c = None
        try:
            if key.startswith("jit-"):
                row.update(status="n/a", error="thunder.jit is not run on the HF model (ThunderFX only)")
                emit(row)
                continue
            c = factory.compile(key, model, is_module=True)
            step_us = []
            toks = decode(c.fn, 2 + cfg.warmup, step_us, cfg)
            first_us, reps, capped = step_us[0], decode.reps, decode.capped
            times = step_us[-reps:]
            same = toks[: HF_CHECK_STEPS + 1] == ref_tokens
            row.update(summarize(times), status="ok", first_call_us=first_us, capped=capped, correct=same,
                       correct_detail=(f"greedy tokens equal ({HF_CHECK_STEPS} steps)" if same else
                                       f"WRONG: greedy tokens {toks[:HF_CHECK_STEPS + 1]} != eager {ref_tokens}"))
            row.update(thunder_info(c))
        except Exception as e:
            record_failure(row, e)
        finally:
            c = None
            reset_compilers()
            free_memory(device)
        emit(row)
    del model
    free_memory(device)


# ----------------------------------------------------------------------------------------------------
# Driver
# ----------------------------------------------------------------------------------------------------


def run_all(spec: dict, stock: bool, emit) -> None:
    """Run every workload and size in ``spec`` for this process's backends (stock or patched)."""
    device = torch.device(spec["device"])
    factory = BackendFactory(device, stock)
    wanted = set(spec["backends"]) if spec.get("backends") else None
    all_keys = factory.keys(wanted)
    torch.manual_seed(0)
    for workload in spec["workloads"]:
        cfg = rep_config(workload, spec["quick"])
        keys = [k for k in all_keys if k not in SKIP.get(workload, ())
                and not (spec["quick"] and k in QUICK_SKIP.get(workload, ()))]
        if not keys:
            continue
        for n in spec["sizes"][workload]:
            log(f"[{'stock' if stock else 'patched'}] {WORKLOAD_TITLES[workload]}: size {n:,} ({', '.join(keys)})")
            t0 = time.perf_counter()
            if workload == "setitem":
                run_setitem(n, keys, factory, cfg, device, emit)
            elif workload in ("token_pool", "gpt_fast"):
                run_pool(workload, n, keys, factory, cfg, device, emit)
            elif workload == "hf_llama":
                run_hf(n, keys, factory, cfg, device, emit)
            log(f"  ... {time.perf_counter() - t0:.1f} s")


def _print_row_progress(row: dict) -> None:
    if row["status"] == "ok":
        cap = f" (reps capped to {row['reps']}: a call takes ~{row['median_us'] / 1e3:,.0f} ms)" if row.get(
            "capped") and row["median_us"] / 1e6 > SLOW_CALL_S else ""
        log(f"  {row['backend']:<22} median {_fmt_time(row['median_us']):>10}  first call "
            f"{_fmt_time(row['first_call_us'])}  {row.get('correct_detail', '')}{cap}")
    else:
        log(f"  {row['backend']:<22} {row['status']}: {row.get('error', '')}")


def worker_main(spec_path: str, out_path: str) -> int:
    """Child process entry point (stock Thunder): run the stock backends, write rows as JSON."""
    spec = json.loads(Path(spec_path).read_text())
    warnings.filterwarnings("ignore")
    if spec.get("threads"):
        torch.set_num_threads(spec["threads"])
    import thunder

    rows = []

    def emit(row):
        row["process"] = "stock"
        _print_row_progress(row)
        rows.append(row)
        Path(out_path).write_text(json.dumps({"rows": rows, "env": _env_info(spec["device"])}))

    Path(out_path).write_text(json.dumps({"rows": rows, "env": _env_info(spec["device"])}))
    run_all(spec, stock=True, emit=emit)
    return 0


def _env_info(device: str) -> dict:
    info = {"torch": torch.__version__, "python": platform.python_version()}
    try:
        import thunder

        info["thunder"] = getattr(thunder, "__version__", "?")
        info["thunder_path"] = str(Path(thunder.__file__).resolve().parent)
    except Exception as e:
        info["thunder"] = _short_error(e)
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except Exception:
        info["transformers"] = None
    try:
        import thunder.dynamo.indexed_writes as iw

        info["thunderfx_policies"] = list(iw.INPLACE_INDEXED_WRITES_POLICIES)
    except Exception:
        info["thunderfx_policies"] = None
    return info


def _machine_info(device: torch.device) -> dict:
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


def _loadavg() -> tuple[float, float, float] | None:
    try:
        return os.getloadavg()
    except OSError:
        return None


def _busy_cpu_s() -> float | None:
    """CPU seconds all processes of the machine have used since boot (Linux ``/proc/stat``)."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
        user, nice, system, idle, iowait, irq, softirq, steal = (int(x) for x in fields[:8])
        return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def _own_cpu_s() -> float:
    import resource

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


def _git_rev() -> str | None:
    root = _repo_root()
    if root is None:
        return None
    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=20)
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True, timeout=20)
        return rev.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def run_stock_child(spec: dict, stock_python: str | None, timeout_s: float) -> tuple[list[dict], dict | None, str | None]:
    """Run the stock backends in a child process with the pristine Thunder. Returns (rows, env, error)."""
    if stock_python is None:
        root = _repo_root()
        candidate = root / "scripts" / "python-stock" if root is not None else None
        if candidate is None or not candidate.exists():
            return [], None, "scripts/python-stock not found (pass --stock-python)"
        stock_python = str(candidate)
    with tempfile.TemporaryDirectory(prefix="inplace_writes_") as tmp:
        spec_path, out_path = Path(tmp) / "spec.json", Path(tmp) / "out.json"
        spec_path.write_text(json.dumps(spec))
        # -P: do not put this file's directory (thunder/benchmarks, full of modules) in front of sys.path.
        cmd = [stock_python, "-P", str(Path(__file__).resolve()), "--worker", str(spec_path), str(out_path)]
        error = None
        try:
            proc = subprocess.run(cmd, stdout=sys.stderr, stderr=None, timeout=timeout_s)
            if proc.returncode != 0:
                error = f"stock worker exited with status {proc.returncode}"
        except subprocess.TimeoutExpired:
            error = f"stock worker timed out after {timeout_s:.0f} s"
        except OSError as e:
            error = f"stock worker could not start: {_short_error(e)}"
        try:
            data = json.loads(out_path.read_text())
        except (OSError, ValueError):
            data = {"rows": [], "env": None}
    return data["rows"], data.get("env"), error


# ----------------------------------------------------------------------------------------------------
# Report
# ----------------------------------------------------------------------------------------------------


def _fmt_time(us: float | None) -> str:
    if us is None or (isinstance(us, float) and math.isnan(us)):
        return "-"
    if us < 1e3:
        return f"{us:.1f} us"
    if us < 1e6:
        return f"{us / 1e3:.2f} ms"
    return f"{us / 1e6:.2f} s"


def _fmt_bytes(b) -> str:
    if b is None:
        return "-"
    if b == 0:
        return "0"
    for unit, div in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if b >= div:
            return f"{b / div:.2f} {unit}"
    return f"{b} B"


def _fmt_ratio(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.1f}x" if x < 100 else f"{x:,.0f}x"


def add_ratios(rows: list[dict]) -> None:
    by_case: dict = {}
    for r in rows:
        if r["status"] == "ok":
            by_case.setdefault((r["workload"], r["size"]), {})[r["backend"]] = r["median_us"]
    for r in rows:
        if r["status"] != "ok":
            continue
        case = by_case[(r["workload"], r["size"])]
        r["vs_eager"] = r["median_us"] / case["eager"] if "eager" in case else None
        r["vs_inductor"] = r["median_us"] / case["inductor"] if "inductor" in case else None


def sort_rows(rows: list[dict]) -> list[dict]:
    def key(r):
        return (WORKLOAD_ORDER.index(r["workload"]), r["size"], BACKEND_ORDER.index(r["backend"])
                if r["backend"] in BACKEND_ORDER else 99)

    return sorted(rows, key=key)


def format_table(rows: list[dict]) -> str:
    headers = ["backend", "median", "min", "max", "reps", "/eager", "/inductor", "segs T+I", "full copies/call",
               "first call", "correct"]
    lines = []
    for workload in WORKLOAD_ORDER:
        wrows = [r for r in rows if r["workload"] == workload]
        if not wrows:
            continue
        lines.append("")
        lines.append(WORKLOAD_TITLES[workload])
        for size in sorted({r["size"] for r in wrows}):
            srows = [r for r in wrows if r["size"] == size]
            lines.append(f"  N = {size:,} ({srows[0].get('size_note', '')})")
            table = []
            for r in srows:
                if r["status"] != "ok":
                    table.append([r["backend"], f"{r['status'].upper()}: {r.get('error', '')}"])
                    continue
                seg = r.get("segments")
                segs = f"{seg['thunder']}+{seg['inductor']}" + (f" ({seg['graphs']}g)" if seg["graphs"] != 1 else "") if seg else "-"
                corr = r.get("correct_detail", "")
                if not r.get("correct", False):
                    corr = "FAIL " + corr
                table.append([
                    r["backend"],
                    _fmt_time(r["median_us"]),
                    _fmt_time(r["min_us"]),
                    _fmt_time(r["max_us"]),
                    f"{r['reps']}{'*' if r.get('capped') and r['median_us'] / 1e6 > SLOW_CALL_S else ''}",
                    _fmt_ratio(r.get("vs_eager")),
                    _fmt_ratio(r.get("vs_inductor")),
                    segs,
                    _fmt_bytes(r.get("full_size_copy_bytes")),
                    _fmt_time(r.get("first_call_us")),
                    corr,
                ])
            widths = [max(len(h), *(len(t[i]) for t in table if len(t) == len(headers))) if any(
                len(t) == len(headers) for t in table) else len(h) for i, h in enumerate(headers)]
            fmt_row = lambda cells: "    " + "  ".join(
                (c.ljust(w) if i in (0, len(headers) - 1) else c.rjust(w)) for i, (c, w) in enumerate(zip(cells, widths)))
            lines.append(fmt_row(headers))
            for t in table:
                if len(t) == len(headers):
                    lines.append(fmt_row(t))
                else:
                    lines.append("    " + t[0].ljust(widths[0]) + "  " + t[1])
    lines.append("")
    lines.append("  times per call (a) or per decode step (b, c, d); /eager, /inductor: median ratio in this run;")
    lines.append("  segs T+I: Thunder + Inductor segments of the ThunderFX split ('g': Dynamo graphs);")
    lines.append("  full copies/call: bytes of full-size copies of inputs in the Thunder execution traces;")
    lines.append(f"  reps*: repetitions capped because a call takes > {SLOW_CALL_S} s.")
    return "\n".join(lines)


def plot(rows: list[dict], path: Path, title: str) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:
        log(f"no plot: {_short_error(e)}")
        return False
    # Panels for the workloads measured at more than one size: (a), (b), and (d) when it has sizes.
    panels = [w for w in ("setitem", "token_pool", "gpt_fast")
              if len({r["size"] for r in rows if r["workload"] == w and r["status"] == "ok"}) > 1]
    if not panels:
        return False
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 5), squeeze=False)
    markers = "osD^v<>ph*"
    for ax, workload in zip(axes[0], panels):
        for j, backend in enumerate(BACKEND_ORDER):
            pts = sorted((r["size"], r["median_us"], r["min_us"], r["max_us"]) for r in rows
                         if r["workload"] == workload and r["backend"] == backend and r["status"] == "ok")
            if not pts:
                continue
            xs = [p[0] for p in pts]
            ys = [p[1] for p in pts]
            yerr = [[p[1] - p[2] for p in pts], [p[3] - p[1] for p in pts]]
            ax.errorbar(xs, ys, yerr=yerr, marker=markers[j % len(markers)], capsize=3, label=backend,
                        linestyle="--" if "stock" in backend or backend.endswith("functional") else "-")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("N (rows in the cache)")
        ax.set_ylabel("time per call / step (us), median, min-max")
        ax.set_title(WORKLOAD_TITLES[workload], fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="python -m thunder.benchmarks.inplace_writes",
        description="In-place indexed KV-cache writes: eager, Inductor, stock and patched Thunder.",
    )
    p.add_argument("--quick", action="store_true", help="small sizes and few repetitions (CI)")
    p.add_argument("--workloads", nargs="+", default=None,
                   help="any of a/setitem, b/token_pool, c/hf_llama, d/gpt_fast (default: all)")
    p.add_argument("--backends", nargs="+", default=None,
                   help=f"subset of {', '.join(BACKEND_ORDER)} ('jit' = the patched jit variant); default: all")
    p.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    p.add_argument("--out", default="results", help="directory for the JSON and PNG results (default: results/)")
    p.add_argument("--no-stock", action="store_true", help="skip the stock-Thunder child process")
    p.add_argument("--stock-python", default=None, help="interpreter with the pristine Thunder "
                   "(default: scripts/python-stock of this repository)")
    p.add_argument("--sizes", nargs="+", type=int, default=None, help="override the sizes of every workload")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads in both processes "
                   "(default: torch's default; note Inductor's CPU kernels are tuned to the thread count "
                   "they were compiled with, and its on-disk cache may hold kernels built for another)")
    p.add_argument("--worker", nargs=2, metavar=("SPEC", "OUT"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.workloads:
        names = []
        for w in args.workloads:
            for part in w.split(","):
                if part.strip():
                    if part.strip() not in WORKLOAD_ALIASES:
                        p.error(f"unknown workload {part!r}")
                    names.append(WORKLOAD_ALIASES[part.strip()])
        args.workloads = [w for w in WORKLOAD_ORDER if w in names]
    else:
        args.workloads = list(QUICK_WORKLOADS if args.quick else WORKLOAD_ORDER)
    if args.backends:
        args.backends = [b for x in args.backends for b in x.split(",") if b]
        for b in args.backends:
            if b not in BACKEND_ORDER and b != "jit":
                p.error(f"unknown backend {b!r}")
    return args


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.worker:
        return worker_main(*args.worker)

    warnings.filterwarnings("ignore")
    t_start = time.perf_counter()
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    sizes = {w: (tuple(args.sizes) if args.sizes else SIZES[w][1 if args.quick else 0]) for w in args.workloads}
    if args.threads:
        torch.set_num_threads(args.threads)
    spec = {"quick": args.quick, "workloads": args.workloads, "sizes": sizes, "device": str(device),
            "backends": args.backends, "threads": args.threads}
    load_start = _loadavg()
    busy_start, own_start = _busy_cpu_s(), _own_cpu_s()
    log(f"inplace_writes benchmark ({'quick' if args.quick else 'full'}) on {device}: "
        + "; ".join(f"{w} {list(sizes[w])}" for w in args.workloads))

    rows: list[dict] = []
    stock_env, stock_error = None, None
    want_stock = not args.no_stock and (not args.backends or any(b in STOCK_BACKENDS for b in args.backends))
    # The stock child runs first and alone, so that its buffers and the parent's are never live together.
    if want_stock:
        log("stock Thunder (child process through scripts/python-stock):")
        t0 = time.perf_counter()
        stock_rows, stock_env, stock_error = run_stock_child(spec, args.stock_python, timeout_s=1500)
        rows.extend(stock_rows)
        log(f"stock child: {len(stock_rows)} results in {time.perf_counter() - t0:.1f} s"
            + (f"; {stock_error}" if stock_error else ""))
        if stock_error and not stock_rows:
            for w in args.workloads:
                for n in sizes[w]:
                    for b in STOCK_BACKENDS:
                        if not args.backends or b in args.backends:
                            rows.append({"workload": w, "size": n, "backend": b, "status": "error",
                                         "error": stock_error, "process": "stock"})

    def emit(row):
        row["process"] = "patched"
        _print_row_progress(row)
        rows.append(row)

    run_all(spec, stock=False, emit=emit)

    rows = sort_rows(rows)
    add_ratios(rows)
    elapsed = time.perf_counter() - t_start
    table = format_table(rows)
    load_end = _loadavg()
    cores = os.cpu_count() or 1
    # CPU used by other processes during the run, in cores: /proc/stat minus this process and its child.
    busy_end = _busy_cpu_s()
    others_cores = None
    if busy_start is not None and busy_end is not None:
        others_cores = max(0.0, (busy_end - busy_start) - (_own_cpu_s() - own_start)) / max(elapsed, 1e-9)
        table += f"\n  Other processes used {others_cores:.2f} of {cores} cores on average during this run."
        if others_cores > 0.25:
            table += ("\n  WARNING: the machine was busy; other processes inflate and scatter the times "
                      "(OpenMP kernels suffer most when threads outnumber free cores).")
    print(table)

    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    machine = _machine_info(device)
    result = {
        "benchmark": "thunder.benchmarks.inplace_writes",
        "timestamp_utc": stamp,
        "mode": "quick" if args.quick else "full",
        "command": [sys.executable, *sys.argv],
        "git_rev": _git_rev(),
        "machine": machine,
        "patched_env": _env_info(str(device)),
        "stock_env": stock_env,
        "stock_error": stock_error,
        "sizes": sizes,
        "elapsed_s": elapsed,
        "loadavg_start": load_start,
        "loadavg_end": load_end,
        "other_processes_cores": others_cores,
        "rows": rows,
        "table": table,
    }
    json_path = out_dir / f"{stamp}.json"
    json_path.write_text(json.dumps(result, indent=1, default=str))
    shutil.copyfile(json_path, out_dir / "latest.json")
    png_path = out_dir / f"{stamp}.png"
    title = (f"in-place indexed writes, {machine['device']} ({machine['cpu']}, {machine['cpu_count']} cores), "
             f"torch {torch.__version__}, {'quick' if args.quick else 'full'} run {stamp}")
    if plot(rows, png_path, title):
        shutil.copyfile(png_path, out_dir / "latest.png")
        print(f"\nwrote {json_path} and {png_path} (+ latest.json, latest.png); elapsed {elapsed:.0f} s")
    else:
        print(f"\nwrote {json_path} (+ latest.json); elapsed {elapsed:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
