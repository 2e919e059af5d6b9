"""Differential fuzzer of in-place indexed writes: eager vs thunder.jit vs ThunderFX (and vs stock).

Each seed makes one small random program (Python source, exec'd, so the printed repro is exactly
what ran) of in-place writes in every form -- `__setitem__` with int / slice / int64 tensor / tuple /
bool mask / Ellipsis / None keys, `index_copy_`, `index_put_`, `index_add_`, `index_fill_`,
`scatter_` (src, value, reduce=), `scatter_add_`, `scatter_reduce_`, `masked_fill_`,
`masked_scatter_`, whole-tensor `add_`/`mul_`/`copy_`/`zero_`/`clamp_` -- through views
(select, narrow, slices, transpose, view, chains of them and the results of in-place ops), on graph
inputs (sometimes non-contiguous, sometimes with a second argument that is a view of the first, or
the same tensor) and on intermediates, with reads of the destinations before and after the writes.

The program runs on fresh copies of the same inputs in eager (the reference) and under each backend
(twice: the second call goes through the caches). Every input after the call and every returned
value must equal eager's: bitwise (`torch.equal`), or allclose where accumulation order may
legitimately differ (index_add_, index_put_(accumulate=True), scatter_add_, scatter_ with reduce,
scatter_reduce_ sum/prod/mean; and returned `.sum()`s). Outcomes:

  OK           equal to eager
  UNSUPPORTED  thunder.jit raised a clear "not supported" error (NotImplementedError or such a
               message) -- acceptable under thunder.jit only: ThunderFX must fall back, not raise
  AS_DYNAMO    ThunderFX raised what Dynamo itself raises while it captures the graph (plain
               torch.compile does the same, with any backend): some torch releases (2.13) reject a bad
               index_copy_ with their own RuntimeError before a backend sees the graph; counted apart
  AS_SAVED_COPY  grad backends: eager's backward raised "modified by an inplace operation" (a tensor it saved
               was written in place later) and the backend computed the gradients instead (Thunder saves a
               copy), equal to eager's under torch.autograd.graph.allow_mutation_on_saved_tensors(), the
               mode in which eager saves copies too; counted apart: not eager's outcome, checked all the same
  MISMATCH     a wrong value in an input (wrong or missing write) or in a returned value, or the call
               leaves grad mode other than eager leaves it
  CRASH        any other exception
  REGRESSION   stock-vs-patched: stock ran the program right under the same backend, this build
               did not (a MISMATCH, CRASH or UNSUPPORTED here); counted on top of that outcome.
               Stock runs jit for jit_functional and tfx for tfx_inductor / tfx_functional
  n/a          the backend needs an option this Thunder lacks (stock has no inplace_indexed_writes)

Keys are valid and duplicate indices appear only where eager is deterministic (accumulating ops,
index_fill_, scatter_ of a scalar value, scatter_reduce_). Some indices are negative where the op
takes them. One program in five has a bad line before its first write, one eager rejects: an
index out of range, a negative index where the op takes none, a short source (masked_scatter_,
index_copy_); the expected outcome is eager's: the same exception type, inputs left as eager left
them (or unchanged).

Backends: jit, jit_dataflow (fusion_type="dataflow"), jit_functional, jit_symbolic (cache="symbolic
values"), jit_standin (the CPU stand-in for nvFuser, thunder/tests/nvfuser_standin.py, where nvFuser
sits on a GPU), jit_torch_compile (torch_compile_ex in front of the defaults), jit_grad,
jit_standin_grad and jit_torch_compile_grad (inputs require grad: gradients of a fixed loss of the
returned values and of the arguments after the call are compared too), tfx (ThunderCompiler(), whose
fusion_type is "dataflow"), tfx_consecutive, tfx_inductor, tfx_functional, tfx_standin,
tfx_torch_compile, tfx_dynamic (torch.compile(dynamic=True)), tfx_grad, tfx_torch_compile_grad.
tfx_inductor, tfx_functional and jit_functional take this fix's inplace_indexed_writes option ("n/a"
on stock). Under Inductor (tfx_inductor, *_torch_compile) values compare with a tolerance.

pytest: the fast profile (`make test`: 16 programs in two chunks, each under jit and two more
backends, round robin; about 2 minutes) fails on failures that stock does not share (FUZZ_STOCK=1, the
default: stock reruns what went wrong here, through scripts/python-stock); the slow one (`-m slow`:
FUZZ_PROGRAMS programs, default 2,000, each under one backend, round robin) fails on every failure.
Both print per backend: programs, outcomes, REGRESSION (stock right, patched wrong) and STOCK_TOO
(failures stock has too). Each test fails once, at the end, with those counts, the distinct failure
kinds and the shrunk source of up to 5 failing programs; build/fuzz-summary.json gets it all.

On CUDA (FUZZ_DEVICE=cuda: the inputs are made on the GPU; `make gpu-check` runs it) the backends without a
fusion executor of their own run nvFuser, the stand-in backends are left out, and jit_nv_scatter /
tfx_nv_scatter add nv_enable_scatter=True.

Standalone (every program under every backend unless --spread; --stock: stock-vs-patched):
  .venv/bin/python tests/test_fuzz_inplace_writes.py --programs 300 --seed 1000 --stock
  scripts/python-stock tests/test_fuzz_inplace_writes.py --programs 300 --seed 1000
  .venv/bin/python tests/test_fuzz_inplace_writes.py --programs 2000 --seed 100000 --spread --stock  # = -m slow
  ... --backends jit,tfx --exclude index_fill,scatter_reduce -v --show SEED ...
  ... --forms copy,no_grad,diagonal ...  # also draw Tensor.copy_, writes under torch.no_grad() and writes
                                        # through diagonal views (every program changes); view_ops: writes
                                        # through Tensor.mT, .T, moveaxis, ravel, type_as, atleast_*d, ...
Some outcomes depend on iteration order inside Thunder, hence on PYTHONHASHSEED: the standalone run
sets it to 0 unless given; a repro states the value it was found with.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import linecache
import logging
import os
import random
import re
import sys
import time
import traceback
import zlib
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent
SUMMARY_JSON = REPO / "build" / "fuzz-summary.json"
# Where the programs' inputs live (and so where they run): "cuda" runs them under nvFuser, Thunder's default
# fusion executor there (`make gpu-check`). The stock child of --stock inherits it through the environment.
DEVICE = os.environ.get("FUZZ_DEVICE", "cpu")
# The composed trees of this build (make setup): a stock run must not see them.
PATCHED_TREES = ("patched", "patched-main")

# ----------------------------------------------------------------------------------------------
# Helpers available to every generated program (and printed at the top of every repro)
# ----------------------------------------------------------------------------------------------

PRELUDE = '''\
import torch


def _t(shape, dtype, seed, ints=False):  # small integers are exact in any summation order
    g = torch.Generator().manual_seed(seed)
    if ints:
        return torch.randint(-4, 5, shape, generator=g).to(dtype)
    return torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)


def _mask(shape, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(shape, generator=g) < 0.5
'''

# Grad backends: the loss and the gradients compared with eager's (printed in grad repros).
GRAD_PRELUDE = '''

def _loss(tensors):
    """One scalar of every floating tensor, with fixed weights: its gradient reaches every read of them."""
    total = torch.zeros((), dtype=torch.float64)
    for k, t in enumerate(tensors):
        if isinstance(t, torch.Tensor) and t.is_floating_point():
            total = total + (t * _t(tuple(t.shape), t.dtype, 7919 + k).to(t.device)).sum().double()
    return total


def _grads(out, inputs, leaves):
    """Gradients of _loss(returned values and the arguments after the call) for each leaf (None: none):
    an argument written in place carries its write's history to the caller, as in eager."""
    loss = _loss([*(out if isinstance(out, tuple) else (out,)), *inputs])
    if not loss.requires_grad:
        return [None] * len(leaves)
    return list(torch.autograd.grad(loss, list(leaves.values()), allow_unused=True))
'''

HELPERS: dict = {}
exec(compile(PRELUDE + GRAD_PRELUDE, "<fuzz-prelude>", "exec"), HELPERS)

# ----------------------------------------------------------------------------------------------
# Program model
# ----------------------------------------------------------------------------------------------


@dataclass
class Input:
    name: str
    expr: str  # builds the input from HELPERS; evaluated afresh for every run
    role: str  # "buf" (a destination), "value", "index", "mask"
    base: str | None = None  # an input that is a view of another input (`alias = buf[1]`): that one


@dataclass
class Stmt:
    kind: str  # e.g. "setitem_tensor", "view_transpose", "read_sum"
    code: str  # one line of the function body
    uses: tuple[str, ...]  # names (inputs and variables) the line reads
    defines: str | None = None  # the variable it binds, if any
    returned: bool = False  # its variable is returned (reads and intermediates)
    tolerant: bool = False  # its result may legitimately differ in rounding (accumulation order)
    alias_of: str | None = None  # `y = t.op_(...)`: the t that y aliases


@dataclass
class Program:
    seed: int
    inputs: list[Input]
    stmts: list[Stmt]
    extra_returns: list[str] = field(default_factory=list)  # views/inputs returned as they are

    @property
    def expects_error(self) -> bool:
        """A line eager rejects (bad input: an index out of range, a short source): eager raises there."""
        return any(s.kind.startswith("bad_") for s in self.stmts)

    @property
    def tolerant(self) -> bool:
        """An accumulating write anywhere: buffers and results are compared with a tolerance."""
        return any(s.kind in ACCUMULATING for s in self.stmts)

    def returns(self) -> list[str]:
        defined = {s.defines for s in self.stmts}
        names = [s.defines for s in self.stmts if s.returned]
        return names + [n for n in self.extra_returns if n in defined or n in {i.name for i in self.inputs}]

    def tolerant_returns(self) -> set[str]:
        return {s.defines for s in self.stmts if s.returned and s.tolerant}

    def arg_inputs(self) -> list[Input]:
        """The function's parameters: the inputs some line uses (or the program returns), and the
        base of any such input that is a view of another (so that the arguments alias)."""
        used = {u for s in self.stmts for u in s.uses} | set(self.returns())
        used |= {i.base for i in self.inputs if i.name in used and i.base}
        return [i for i in self.inputs if i.name in used]

    def source(self) -> str:
        args = ", ".join(i.name for i in self.arg_inputs())
        body = [f"    {s.code}" for s in self.stmts]
        rets = self.returns()
        body.append(f"    return {', '.join(rets)}" + ("," if len(rets) == 1 else "") if rets else "    return None")
        return f"def fn({args}):\n" + "\n".join(body) + "\n"

    def inputs_source(self, grad: bool = False) -> str:
        """make_inputs() -> (arguments, leaves requiring grad), as make_inputs(grad) builds them."""
        args, lines, leaves = self.arg_inputs(), [], []
        for i in args:
            i = _on_device(i)
            if not (grad and _gets_grad(i)):
                lines.append(f"    {i.name} = {i.expr}")
            elif i.role == "buf":  # a destination: a clone of its leaf (eager rejects writes into leaves)
                lines += [f"    {i.name}_leaf = ({i.expr}).detach().requires_grad_()", f"    {i.name} = {i.name}_leaf.clone()"]
                leaves.append(f"{i.name}={i.name}_leaf")
            else:
                lines.append(f"    {i.name} = ({i.expr}).detach().requires_grad_()")
                leaves.append(f"{i.name}={i.name}")
        ret = f"dict({', '.join(f'{i.name}={i.name}' for i in args)}), dict({', '.join(leaves)})"
        return "def make_inputs():\n" + "\n".join(lines) + f"\n    return {ret}\n"

    def make_inputs(self, grad: bool = False) -> tuple[list[torch.Tensor], dict[str, torch.Tensor]]:
        """Fresh arguments, and (grad) the leaves requiring grad: each floating destination or value
        input that is not a view of another becomes a leaf; a destination gets a clone of it."""
        env, leaves = dict(HELPERS), {}
        for i in self.arg_inputs():
            # .to() of a view of an input already moved is the view itself: arguments still alias
            x = eval(i.expr, env).to(DEVICE)
            if grad and _gets_grad(i):
                leaves[i.name] = x.detach().requires_grad_()
                x = leaves[i.name].clone() if i.role == "buf" else leaves[i.name]
            env[i.name] = x
        return [env[i.name] for i in self.arg_inputs()], leaves

    def function(self) -> Callable:
        """The program as a function, exec'd from its source (registered with linecache, so that
        tracebacks, Dynamo and Thunder see the real lines)."""
        src = self.source()
        filename = f"<fuzz-program-{self.seed}-{zlib.crc32(src.encode()):08x}>"
        linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)
        namespace = dict(HELPERS)
        exec(compile(src, filename, "exec"), namespace)
        return namespace["fn"]

    def repro(self, backend: str | None = None) -> str:
        b = BACKENDS[backend or "jit"]
        imports = "import torch\nimport thunder\nfrom thunder.dynamo import ThunderCompiler\n" + b.imports
        return (
            f"# fuzz seed {self.seed}" + (f", backend {backend}" if backend else "") + "\n"
            + PRELUDE.replace("import torch\n", imports) + (GRAD_PRELUDE if b.grad else "")
            + "\n\n" + self.inputs_source(b.grad) + "\n\n" + self.source() + "\n\n"
            + f"# PYTHONHASHSEED={os.environ.get('PYTHONHASHSEED', 'random')} when found (some outcomes depend on it)\n"
            + "def run(f):\n"
            + "    inputs, leaves = make_inputs()\n"
            + "    try:\n"
            + "        out = f(*inputs.values())\n"
            + ("        grads = _grads(out, list(inputs.values()), leaves)\n" if b.grad else "")
            + "    except Exception as e:\n"
            + "        return f'raised {type(e).__name__}: {e}', inputs, None, None\n"
            + "    return out, inputs, leaves, " + ("grads" if b.grad else "None") + "\n\n\n"
            + "ref, ref_in, leaves, ref_grads = run(fn)\n"
            + f"got, got_in, _, got_grads = run({b.repro})\n"
            + self._verdict_source(b)
        )

    def _verdict_source(self, backend: Backend) -> str:
        tol = "rtol=1.6e-2, atol=1e-2" if "bfloat16" in self.inputs[0].expr else "rtol=1e-6, atol=1e-6"
        close = f"lambda a, b: torch.allclose(a, b, {tol})"
        # accumulating ops and Inductor: summation order may differ; gradients always compare so
        same = close if self.tolerant or backend.inductor else "torch.equal"
        grads = (
            "    zero = lambda x, like: torch.zeros_like(like) if x is None else x\n"
            + "    pairs += [(f'grad of {k}', zero(a, l), zero(b, l), close)\n"
            + "              for (k, l), a, b in zip(leaves.items(), ref_grads, got_grads)]\n"
        ) if backend.grad else ""
        return (
            f"same, close = {same}, {close}\n"
            + "if isinstance(ref, str) or isinstance(got, str):\n"
            + "    print('eager:', ref if isinstance(ref, str) else 'returned')\n"
            + "    print('got:  ', got if isinstance(got, str) else 'returned')\n"
            + "pairs = [(k, ref_in[k], got_in[k], same) for k in ref_in]\n"
            + "if not isinstance(ref, str) and not isinstance(got, str):\n"
            + "    pairs += [('returned', a, b, same) for a, b in zip(ref or (), got or ())]\n"
            + grads
            + "for name, a, b, eq in pairs:\n"
            + "    print(name, 'same as eager' if eq(a.detach(), b.detach()) else f'DIFFERS FROM EAGER\\neager: {a}\\ngot:   {b}')\n"
        )


def _on_device(i: Input) -> Input:
    """The input as a repro builds it: moved to DEVICE where that is not the CPU."""
    return i if DEVICE == "cpu" else Input(i.name, f"({i.expr}).to({DEVICE!r})", i.role, i.base)


def _gets_grad(i: Input) -> bool:
    """Under a grad backend: destinations and written values (all floating) that are not views of
    another input become leaves requiring grad."""
    return i.role in ("buf", "value") and i.base is None


# Writes whose result depends on accumulation order (compared with a tolerance).
ACCUMULATING = {"index_add", "index_put_acc", "scatter_add", "scatter_with_reduce", "scatter_reduce_acc"}

# ----------------------------------------------------------------------------------------------
# Generator
# ----------------------------------------------------------------------------------------------

DTYPES = [("torch.float32", 0.75), ("torch.float64", 0.1), ("torch.bfloat16", 0.15)]


@dataclass
class Var:
    name: str
    kind: str  # "buf" (graph input destination), "tmp" (intermediate), "view", "read"


class InvalidProgram(Exception):
    """The generator built a line eager rejects: a generator bug; the program is discarded."""


class Generator:
    """Builds a program line by line, running each line eagerly as it goes, so every choice (shapes,
    value shapes, mask counts, contiguity for .view) is made from the real tensors."""

    def __init__(self, seed: int, draw: str | None = None, exclude: frozenset[str] = frozenset()):
        self.seed = seed
        self.exclude = exclude  # op names (keys of WRITES, VIEWS, ...) not to draw
        self.rng = random.Random(seed if draw is None else draw)
        # Draws for features added later (aliasing and non-contiguous inputs): a stream of their own,
        # so that the programs of seeds that don't use them stay what they were.
        self.aux = random.Random(f"{seed if draw is None else draw}/aux")
        # Bad input (a line eager rejects) and valid negative indices: a third stream, same reason.
        self.bad = random.Random(f"{seed if draw is None else draw}/bad")
        self.dtype = self.rng.choices([d for d, _ in DTYPES], [w for _, w in DTYPES])[0]
        self.ints = self.rng.random() < 0.6
        self.env: dict = dict(HELPERS)
        self.inputs: list[Input] = []
        self.stmts: list[Stmt] = []
        self.vars: dict[str, Var] = {}
        self.counts: Counter = Counter()

    # -- names, inputs, literals ----------------------------------------------------------------

    def fresh(self, prefix: str) -> str:
        self.counts[prefix] += 1
        return f"{prefix}{self.counts[prefix] - 1}"

    def add_input(self, prefix: str, expr: str, role: str, base: str | None = None) -> str:
        name = prefix if prefix in ("buf", "other", "alias") else self.fresh(prefix)
        self.inputs.append(Input(name, expr, role, base))
        self.env[name] = eval(expr, self.env)
        if role == "buf":
            self.vars[name] = Var(name, "buf")
        return name

    def data(self, shape) -> str:
        return self.add_input("v", f"_t({tuple(shape)}, {self.dtype}, {self.rng.randrange(10**4)}, ints={self.ints})", "value")

    def index(self, values: list[int]) -> str:
        return self.add_input("i", f"torch.tensor({values})", "index")

    def mask(self, shape) -> str:
        return self.add_input("m", f"_mask({tuple(shape)}, {self.rng.randrange(10**4)})", "mask")

    def scalar(self) -> str:
        return self.rng.choice(["0.0", "1.0", "-2.0", "1.5", "3.0", "-0.5"])

    def unique_ids(self, size: int, negative_ok: bool = True) -> list[int]:
        ids = self.rng.sample(range(size), self.rng.randint(1, size))
        if negative_ok and self.rng.random() < 0.2:
            ids = [i - size if self.rng.random() < 0.5 else i for i in ids]
        return ids

    def any_ids(self, size: int, negative_ok: bool = False) -> list[int]:
        ids = [self.rng.randrange(size) for _ in range(self.rng.randint(1, size + 2))]
        if negative_ok and self.bad.random() < 0.25:  # negative indices, where the op takes them
            ids = [i - size if self.bad.random() < 0.5 else i for i in ids]
        return ids

    def value_for(self, shape) -> str:
        """A value for a write of `shape`: a scalar, a tensor of that shape, or a broadcast one."""
        r = self.rng.random()
        if r < 0.3 or len(shape) == 0:
            return self.scalar()
        if r < 0.85 or len(shape) == 0:
            return self.data(shape)
        return self.data(shape[self.rng.randint(1, len(shape)) :])

    # -- running lines --------------------------------------------------------------------------

    def t(self, name: str) -> torch.Tensor:
        return self.env[name]

    def shape_of(self, expr: str) -> tuple:
        return tuple(eval(expr, self.env).shape)

    def emit(self, kind: str, code: str, uses, defines=None, var_kind=None, returned=False, tolerant=False, alias_of=None):
        try:
            exec(code, self.env)
        except Exception as e:
            raise InvalidProgram(f"{kind}: {code}: {type(e).__name__}: {e}") from e
        self.stmts.append(Stmt(kind, code, tuple(uses), defines, returned, tolerant, alias_of))
        if defines and var_kind:
            self.vars[defines] = Var(defines, var_kind)

    def targets(self) -> list[str]:
        """Variables one can write into: inputs, intermediates, views of them (no 0-d tensors)."""
        return [v.name for v in self.vars.values() if v.kind != "read" and self.t(v.name).ndim >= 1]

    def sources_for(self, dst: str) -> list[str]:
        """Tensors that may feed a write into dst: none sharing dst's storage (eager leaves
        overlapping in-place reads/writes unspecified)."""
        ptr = self.t(dst).untyped_storage().data_ptr()
        return [n for n in self.vars if self.t(n).untyped_storage().data_ptr() != ptr]

    def inplace(self, kind: str, target: str, call: str, uses, bind: float = 0.15):
        """Emit an in-place method call on target; with probability `bind` bind its result
        (`y = t.op_(...)`), a variable aliasing target that later lines may write through."""
        if self.rng.random() < bind:
            y = self.fresh("y")
            self.emit(kind, f"{y} = {call}", (target, *uses), y, "view", alias_of=target)
        else:
            self.emit(kind, call, (target, *uses))

    # -- the program ----------------------------------------------------------------------------

    def program(self) -> Program:
        rng = self.rng
        ndim = rng.choice([1, 2, 2, 3, 3])
        shape = [rng.randint(2, 8) for _ in range(min(ndim, 2))] + ([rng.randint(1, 4)] if ndim == 3 else [])
        buf = f"_t({tuple(shape)}, {self.dtype}, {rng.randrange(10**4)}, ints={self.ints})"
        if ndim >= 2 and self.aux.random() < 0.1:  # a non-contiguous graph input
            buf += ".transpose(0, 1)"
        self.add_input("buf", buf, "buf")
        if self.aux.random() < 0.12:  # a second argument that is a view of buf (or buf itself)
            x = self.t("buf")
            views = ["", f"[{self.aux.randrange(x.shape[0])}:]"]
            if x.ndim >= 2:
                views += [f"[{self.aux.randrange(x.shape[0])}]", ".transpose(0, 1)", f"[:, {self.aux.randrange(x.shape[1])}]"]
            if x.is_contiguous():
                views.append(".view(-1)")
            self.add_input("alias", f"buf{self.aux.choice(views)}", "buf", base="buf")
        if rng.random() < 0.3:
            shape2 = [rng.randint(2, 6) for _ in range(rng.randint(1, 2))]
            self.add_input("other", f"_t({tuple(shape2)}, {self.dtype}, {rng.randrange(10**4)}, ints={self.ints})", "buf")
        n_stmts = rng.randint(2, 8)
        kinds = [(WRITES, 0.45), (VIEWS, 0.15), (READS, 0.18), (INTERMEDIATES, 0.08), (WHOLE, 0.09), (BIND_INPLACE, 0.05)]
        extra_table = {op: f for op, f in EXTRA_FORMS.items() if op in extra_forms()}
        if extra_table:  # opt in (--forms): with them the programs of every seed change
            kinds.append((extra_table, 0.15))
        wrote, draws = False, 0
        # Bad input: a write eager rejects, drawn just before the first write (so eager has written
        # nothing when it raises); the lines after it stay, and must not run either.
        # On CUDA none: an index out of range is a device-side assert there, eager's too, and it leaves the
        # process's CUDA context unusable for every later program.
        bad_ops = [op for op in BAD if op not in self.exclude] if DEVICE == "cpu" else []
        bad_pending = bool(bad_ops) and self.bad.random() < BAD_PROGRAM_SHARE
        while len(self.stmts) < n_stmts or not wrote:
            draws += 1
            if draws > 500:
                raise InvalidProgram("no applicable op (too much excluded?)")
            table = rng.choices([k for k, _ in kinds], [w for _, w in kinds])[0]
            ops = [op for op in table if op not in self.exclude]
            if not ops:
                continue
            op = rng.choice(ops)
            target = rng.choice(self.targets())
            if bad_pending and (table in (WRITES, WHOLE, BIND_INPLACE) or table is extra_table):
                bad_pending = BAD[self.bad.choice(bad_ops)](self, self.bad.choice(self.targets())) is False
            if table[op](self, target) is not False:
                wrote |= table is WRITES or table is WHOLE or table is BIND_INPLACE or table is extra_table
        extra = []
        if rng.random() < 0.15:
            extra.append(rng.choice([v.name for v in self.vars.values() if v.kind in ("view", "buf")]))
        for v in self.vars.values():  # intermediates are returned at their final value
            if v.kind == "tmp":
                extra.append(v.name)
        return Program(self.seed, self.inputs, self.stmts, extra)


def generate(seed: int, exclude: frozenset[str] = frozenset()) -> Program:
    """The program of a seed; a seed whose draw fails in eager (a generator bug) tries sub-seeds."""
    for attempt in range(20):
        try:
            return Generator(seed, None if attempt == 0 else f"{seed}/{attempt}", exclude).program()
        except InvalidProgram:
            continue
    raise RuntimeError(f"seed {seed}: no valid program in 20 attempts")

# ----------------------------------------------------------------------------------------------
# One generator function per op kind. Each gets the generator and a target variable name, adds
# whatever inputs it needs, and emits its line; returning False means "not applicable here".
# ----------------------------------------------------------------------------------------------


def _slice_key(g: Generator, size: int) -> str:
    a = g.rng.randrange(size)
    b = g.rng.randint(a + 1, size)
    step = ":2" if g.rng.random() < 0.25 else ""
    return f"{a}:{b}{step}"


def _setitem(g: Generator, t: str, key: str, kind: str, uses=(), value: str | None = None):
    value = value or g.value_for(g.shape_of(f"{t}[{key}]"))
    g.emit(kind, f"{t}[{key}] = {value}", (t, *uses, value))


def w_setitem_int(g, t):
    size = g.t(t).shape[0]
    _setitem(g, t, str(g.rng.randint(-size, size - 1)), "setitem_int")


def w_setitem_slice(g, t):
    s = g.t(t).shape
    d = g.rng.randrange(min(len(s), 2))
    _setitem(g, t, ":, " * d + _slice_key(g, s[d]), "setitem_slice")


def w_setitem_tensor(g, t):
    i = g.index(g.unique_ids(g.t(t).shape[0]))
    _setitem(g, t, i, "setitem_tensor", (i,))


def w_setitem_tuple(g, t):
    s = g.t(t).shape
    if len(s) < 2:
        return False
    form = g.rng.randrange(5)
    if form == 0:  # t[k, i]
        i = g.index(g.unique_ids(s[1]))
        key, uses = f"{g.rng.randrange(s[0])}, {i}", (i,)
    elif form == 1:  # t[i, k]
        i = g.index(g.unique_ids(s[0]))
        key, uses = f"{i}, {g.rng.randrange(-s[1], s[1])}", (i,)
    elif form == 2:  # t[a:b, i]
        i = g.index(g.unique_ids(s[1]))
        key, uses = f"{_slice_key(g, s[0])}, {i}", (i,)
    elif form == 3:  # t[i, j]: pairs unique because i is
        rows = g.unique_ids(s[0])
        i, j = g.index(rows), g.index([g.rng.randrange(s[1]) for _ in rows])
        key, uses = f"{i}, {j}", (i, j)
    else:  # t[k, a:b]
        key, uses = f"{g.rng.randrange(s[0])}, {_slice_key(g, s[1])}", ()
    _setitem(g, t, key, "setitem_tuple", uses)


def w_setitem_mask(g, t):
    s = g.t(t).shape
    r = g.rng.random()
    if r < 0.25:  # mask computed from the destination itself (a read of it)
        g.emit("setitem_mask", f"{t}[{t} > 0] = {g.scalar()}", (t,))
        return
    m = g.mask(s if r < 0.7 else s[:1])
    _setitem(g, t, m, "setitem_mask", (m,))


def w_setitem_ellipsis(g, t):
    s = g.t(t).shape
    form = g.rng.randrange(3)
    key = ["...", f"..., {g.rng.randrange(s[-1])}", f"..., {_slice_key(g, s[-1])}"][form]
    _setitem(g, t, key, "setitem_ellipsis")


def w_setitem_none(g, t):
    s = g.t(t).shape
    key = g.rng.choice([f"None, {g.rng.randrange(s[0])}", f"{_slice_key(g, s[0])}, None", "None"])
    _setitem(g, t, key, "setitem_none")


def w_index_copy(g, t):
    s = list(g.t(t).shape)
    d = g.rng.randrange(len(s))
    ids = g.unique_ids(s[d], negative_ok=False)
    i, v = g.index(ids), g.data(s[:d] + [len(ids)] + s[d + 1 :])
    g.inplace("index_copy", t, f"{t}.index_copy_({d}, {i}, {v})", (i, v))


def w_index_put(g, t):
    s = list(g.t(t).shape)
    acc = g.rng.random() < 0.5
    if len(s) >= 2 and g.rng.random() < 0.4:
        rows = g.any_ids(s[0], negative_ok=True) if acc else g.unique_ids(s[0])
        idx = [g.index(rows), g.index([g.rng.randrange(-s[1], s[1]) for _ in rows])]
    else:
        idx = [g.index(g.any_ids(s[0], negative_ok=True) if acc else g.unique_ids(s[0]))]
    key = "(" + ", ".join(idx) + ("," if len(idx) == 1 else "") + ")"
    vshape = list(g.shape_of(f"{t}[{key}]"))
    v = g.data(vshape if g.rng.random() < 0.8 else vshape[1:])
    g.inplace("index_put_acc" if acc else "index_put", t, f"{t}.index_put_({key}, {v}, accumulate={acc})", (*idx, v))


def w_index_add(g, t):
    s = list(g.t(t).shape)
    d = g.rng.randrange(len(s))
    ids = g.any_ids(s[d])
    i, v = g.index(ids), g.data(s[:d] + [len(ids)] + s[d + 1 :])
    alpha = g.rng.choice(["", "", ", alpha=2", ", alpha=-1", ", alpha=0.5"])
    g.inplace("index_add", t, f"{t}.index_add_({d}, {i}, {v}{alpha})", (i, v))


def w_index_fill(g, t):
    s = g.t(t).shape
    d = g.rng.randrange(len(s))
    i = g.index(g.any_ids(s[d], negative_ok=True))
    g.inplace("index_fill", t, f"{t}.index_fill_({d}, {i}, {g.scalar()})", (i,))


def _scatter_index(g: Generator, s, d: int, unique: bool) -> tuple[str, list[int]]:
    """An index for scatter along d: shape <= s; unique along d in every line if asked."""
    ishape = [g.rng.randint(1, n) for n in s]
    other = [n for k, n in enumerate(ishape) if k != d]
    lines = []
    for _ in range(max(1, int(torch.tensor(other).prod()) if other else 1)):
        if unique:
            lines.append(g.rng.sample(range(s[d]), ishape[d]))
        else:
            lines.append([g.rng.randrange(s[d]) for _ in range(ishape[d])])
    idx = torch.tensor(lines, dtype=torch.int64).reshape(other + [ishape[d]]).movedim(-1, d)
    return g.add_input("i", f"torch.tensor({idx.tolist()})", "index"), ishape


def w_scatter(g, t):
    s = list(g.t(t).shape)
    d = g.rng.randrange(len(s))
    form = g.rng.choice(["src", "value", "reduce_src", "reduce_value"])
    i, ishape = _scatter_index(g, s, d, unique=form == "src")
    src = g.data(ishape) if form in ("src", "reduce_src") else g.scalar()
    reduce = f", reduce={g.rng.choice(['add', 'multiply'])!r}" if form.startswith("reduce") else ""
    kind = "scatter_with_reduce" if reduce else ("scatter_src" if form == "src" else "scatter_value")
    g.inplace(kind, t, f"{t}.scatter_({d}, {i}, {src}{reduce})", (i, src) if form.endswith("src") else (i,))


def w_scatter_add(g, t):
    s = list(g.t(t).shape)
    d = g.rng.randrange(len(s))
    i, ishape = _scatter_index(g, s, d, unique=False)
    v = g.data(ishape)
    g.inplace("scatter_add", t, f"{t}.scatter_add_({d}, {i}, {v})", (i, v))


def w_scatter_reduce(g, t):
    s = list(g.t(t).shape)
    d = g.rng.randrange(len(s))
    i, ishape = _scatter_index(g, s, d, unique=False)
    v = g.data(ishape)
    reduce = g.rng.choice(["sum", "prod", "mean", "amax", "amin"])
    include_self = g.rng.choice([True, False])
    kind = "scatter_reduce_acc" if reduce in ("sum", "prod", "mean") else "scatter_reduce_minmax"
    g.inplace(kind, t, f"{t}.scatter_reduce_({d}, {i}, {v}, {reduce!r}, include_self={include_self})", (i, v))


def w_masked_fill(g, t):
    s = g.t(t).shape
    r = g.rng.random()
    if r < 0.25:
        call, uses = f"{t}.masked_fill_({t} < 0, {g.scalar()})", ()
    else:
        m = g.mask(s if r < 0.75 else s[-1:])
        call, uses = f"{t}.masked_fill_({m}, {g.scalar()})", (m,)
    g.inplace("masked_fill", t, call, uses)


def w_masked_scatter(g, t):
    s = g.t(t).shape
    m = g.mask(s if g.rng.random() < 0.7 else s[-1:])
    v = g.data(s)  # numel >= the number of set mask elements, however the mask broadcasts
    g.inplace("masked_scatter", t, f"{t}.masked_scatter_({m}, {v})", (m, v))


def x_copy(g, t):
    s = list(g.t(t).shape)
    src = g.data(s if g.rng.random() < 0.6 else s[-1:])  # whole, or broadcast along the leading dims
    g.inplace("copy", t, f"{t}.copy_({src})", (src,))


def x_no_grad_write(g, t):
    """A write of WRITES or WHOLE made under torch.no_grad(): eager keeps the destination's history."""
    table = WRITES if g.rng.random() < 0.7 else WHOLE
    before = len(g.stmts)
    if table[g.rng.choice(list(table))](g, t) is False or len(g.stmts) != before + 1:
        del g.stmts[before:]
        return False
    stmt = g.stmts[-1]
    g.stmts[-1] = dataclasses.replace(stmt, kind=f"no_grad_{stmt.kind}", code=f"with torch.no_grad(): {stmt.code}")


def x_diagonal_write(g, t):
    """A write through a diagonal view: Thunder's diagonal is a gather, and a fusion that made it wrote into a
    copy (0074). The view stays a variable, so later lines may read or write through it too."""
    s = g.t(t).shape
    if len(s) < 2:
        return False
    d1, d2 = (0, 1) if len(s) == 2 or g.rng.random() < 0.5 else (g.rng.choice([0, 1]), 2)
    offsets = [0] + ([1] if s[d2] > 1 else []) + ([-1] if s[d1] > 1 else [])
    _view(g, t, "view_diagonal", f"{t}.diagonal({g.rng.choice(offsets)}, {d1}, {d2})")
    whole(g, g.stmts[-1].defines)


def x_view_op_write(g, t):
    """A whole-tensor write through a view made by one of the ops that 0075 lists as view ops (Tensor.mT, .T,
    torch fallbacks, `to` in other names, atleast_*d): before it a read after such a write could move before it,
    and a fusion made the view a copy. The view stays a variable, so later lines may write through it too."""
    x = g.t(t)
    d = g.rng.randrange(x.ndim)
    exprs = [f"{t}.positive()", f"{t}.type_as({t})", f"{t}.ravel()", f"torch.atleast_2d({t})", f"torch.atleast_3d({t})"]
    if x.shape[d] >= 2:
        exprs.append(f"{t}.unsafe_chunk(2, {d})[{g.rng.randrange(2)}]")
    if x.ndim >= 2:
        exprs += [f"{t}.mT", f"{t}.moveaxis(0, -1)", f"{t}.swapaxes(0, 1)", f"{t}.mT.mT"]
    if x.ndim == 2:
        exprs += [f"{t}.T", f"{t}.T[1:]"]
    _view(g, t, "view_op", g.rng.choice(exprs))
    if g.t(g.stmts[-1].defines).numel() == 0:
        return False
    whole(g, g.stmts[-1].defines)


# Write forms drawn only when asked for (--forms, or FUZZ_FORMS for the stock child): they change every program.
EXTRA_FORMS = {"copy": x_copy, "no_grad": x_no_grad_write, "diagonal": x_diagonal_write, "view_ops": x_view_op_write}


def extra_forms() -> frozenset[str]:
    return frozenset(x for x in os.environ.get("FUZZ_FORMS", "").split(",") if x)


WRITES = {
    "setitem_int": w_setitem_int,
    "setitem_slice": w_setitem_slice,
    "setitem_tensor": w_setitem_tensor,
    "setitem_tuple": w_setitem_tuple,
    "setitem_mask": w_setitem_mask,
    "setitem_ellipsis": w_setitem_ellipsis,
    "setitem_none": w_setitem_none,
    "index_copy": w_index_copy,
    "index_put": w_index_put,
    "index_add": w_index_add,
    "index_fill": w_index_fill,
    "scatter": w_scatter,
    "scatter_add": w_scatter_add,
    "scatter_reduce": w_scatter_reduce,
    "masked_fill": w_masked_fill,
    "masked_scatter": w_masked_scatter,
}

# -- views ---------------------------------------------------------------------------------------


def _view(g: Generator, t: str, kind: str, expr: str):
    v = g.fresh("t")
    g.emit(kind, f"{v} = {expr}", (t,), v, "view")


def v_select(g, t):
    s = g.t(t).shape
    if len(s) < 2:
        return False
    _view(g, t, "view_select", f"{t}[{g.rng.randrange(-s[0], s[0])}]")


def v_narrow(g, t):
    s = g.t(t).shape
    d = g.rng.randrange(len(s))
    start = g.rng.randrange(s[d])
    _view(g, t, "view_narrow", f"{t}.narrow({d}, {start}, {g.rng.randint(1, s[d] - start)})")


def v_slice(g, t):
    s = g.t(t).shape
    d = g.rng.randrange(min(len(s), 2))
    _view(g, t, "view_slice", f"{t}[{':, ' * d}{_slice_key(g, s[d])}]")


def v_transpose(g, t):
    if g.t(t).ndim < 2:
        return False
    _view(g, t, "view_transpose", f"{t}.transpose(0, 1)")


def v_view(g, t):
    x = g.t(t)
    shapes = [(-1,)]
    if x.ndim >= 2:
        shapes.append((x.shape[0] * x.shape[1], *x.shape[2:]))
    if x.shape[0] % 2 == 0 and x.shape[0] > 2:
        shapes.append((2, x.shape[0] // 2, *x.shape[1:]))
    shape = g.rng.choice(shapes)
    try:
        x.view(shape)
    except RuntimeError:  # not viewable with these strides
        return False
    _view(g, t, "view_view", f"{t}.view{shape}" if len(shape) > 1 else f"{t}.view({shape[0]})")


VIEWS = {"select": v_select, "narrow": v_narrow, "slice": v_slice, "transpose": v_transpose, "view": v_view}

# -- whole-tensor in-place ops, bound results of in-place ops --------------------------------------


def _whole_op(g: Generator, t: str) -> tuple[str, tuple[str, ...], str]:
    s = tuple(g.t(t).shape)
    op = g.rng.choice(["add", "add_tensor", "mul", "copy", "zero", "clamp"])
    if op == "add":
        return f"{t}.add_({g.scalar()})", (t,), "whole_add"
    if op == "mul":
        return f"{t}.mul_({g.rng.choice(['2.0', '-1.0', '0.5'])})", (t,), "whole_mul"
    if op == "zero":
        return f"{t}.zero_()", (t,), "whole_zero"
    if op == "clamp":
        return f"{t}.clamp_(min={g.rng.choice(['-1.0', '0.0'])}, max={g.rng.choice(['1.0', '2.0'])})", (t,), "whole_clamp"
    # add_/copy_ of a tensor: a value input, or another variable of a matching shape in another storage
    others = [n for n in g.sources_for(t) if tuple(g.t(n).shape) == s and g.t(n).dtype == g.t(t).dtype]
    src = g.rng.choice(others) if others and g.rng.random() < 0.4 else g.data(s if g.rng.random() < 0.8 else s[-1:])
    return f"{t}.{'add_' if op == 'add_tensor' else 'copy_'}({src})", (t, src), f"whole_{op}"


def whole(g, t):
    call, uses, kind = _whole_op(g, t)
    g.emit(kind, call, uses)


def bind_inplace(g, t):
    """`y = t.add_(1)`: y aliases t; later lines write through it."""
    call, uses, kind = _whole_op(g, t)
    g.inplace(kind, t, call, uses[1:], bind=1.0)


WHOLE = {"whole": whole}
BIND_INPLACE = {"bind": bind_inplace}

# -- reads and intermediates ---------------------------------------------------------------------


def r_clone(g, t):
    r = g.fresh("r")
    g.emit("read_clone", f"{r} = {t}.clone()", (t,), r, "read", returned=True)


def r_sum(g, t):
    r = g.fresh("s")
    g.emit("read_sum", f"{r} = {t}.sum()", (t,), r, "read", returned=True, tolerant=True)


def r_arith(g, t):
    r = g.fresh("r")
    g.emit("read_arith", f"{r} = {t} * {g.rng.choice(['2', '3', '-1'])}", (t,), r, "read", returned=True)


def r_row(g, t):
    s = g.t(t).shape
    r = g.fresh("r")
    g.emit("read_row", f"{r} = {t}[{g.rng.randrange(s[0])}].clone()", (t,), r, "read", returned=True)


READS = {"clone": r_clone, "sum": r_sum, "arith": r_arith, "row": r_row}


def i_arith(g, t):
    x = g.fresh("x")
    expr = g.rng.choice([f"{t} * 2", f"{t} + 1", f"{t}.clone()", f"torch.zeros_like({t})"])
    g.emit("intermediate", f"{x} = {expr}", (t,), x, "tmp")


INTERMEDIATES = {"intermediate": i_arith}


# -- bad input: writes eager rejects ---------------------------------------------------------------
# The expected outcome is eager's: the same exception type, and the inputs as eager leaves them (here
# unchanged: the bad index comes first, so eager has written nothing; a short masked_scatter_ source
# is the exception: eager writes the elements it has, so the inputs may be eager's or unchanged).
# All draws come from g.bad.

BAD_PROGRAM_SHARE = 0.2  # programs with a bad line


def _bad_index(g: Generator, size: int, kind: str) -> int:
    if kind == "negative":
        return -g.bad.randint(1, size)
    return g.bad.choice([size + g.bad.randrange(3), -size - 1 - g.bad.randrange(3)])


def _bad_data(g: Generator, shape) -> str:
    return g.add_input("v", f"_t({tuple(shape)}, {g.dtype}, {g.bad.randrange(10**4)}, ints={g.ints})", "value")


def _emit_bad(g: Generator, kind: str, t: str, code: str, uses) -> bool | None:
    """Emit `code` if eager rejects it; it runs on a clone of t, so g's tensors stay as they were."""
    scratch = dict(g.env)
    scratch[t] = g.t(t).clone()
    try:
        exec(code, scratch)
    except (IndexError, RuntimeError, ValueError):
        g.stmts.append(Stmt(kind, code, (t, *uses)))
        return None
    except Exception as e:  # noqa: BLE001 - a generator bug, not bad input
        raise InvalidProgram(f"{kind}: {code}: {type(e).__name__}: {e}") from e
    return False  # eager takes it (e.g. a negative index that wraps): not a bad line


def b_index_out_of_range(g, t, kind="oob"):
    """An index out of range (first, so eager writes nothing) in one of the indexed writes."""
    s = list(g.t(t).shape)
    forms = ["setitem", "index_copy", "index_put", "index_add", "index_fill", "scatter", "scatter_add"]
    if kind == "negative":  # the ops that reject negative indices (setitem, index_put, index_fill wrap them)
        forms = ["index_copy", "index_add", "scatter", "scatter_add"]
    form = g.bad.choice(forms)
    d = 0 if form == "index_put" else g.bad.randrange(len(s))
    ids = [_bad_index(g, s[d], kind)] + [g.bad.randrange(s[d]) for _ in range(g.bad.randint(1, s[d]) - 1)]
    if form == "setitem":
        i = g.index(ids)
        return _emit_bad(g, f"bad_{kind}_setitem", t, f"{t}[{':, ' * d}{i}] = {g.bad.choice(['1.5', '-2.0'])}", (i,))
    if form == "index_put":
        i, v = g.index(ids), _bad_data(g, [len(ids)] + s[1:])
        return _emit_bad(g, f"bad_{kind}_index_put", t, f"{t}.index_put_(({i},), {v})", (i, v))
    if form in ("index_copy", "index_add"):
        i, v = g.index(ids), _bad_data(g, s[:d] + [len(ids)] + s[d + 1 :])
        return _emit_bad(g, f"bad_{kind}_{form}", t, f"{t}.{form}_({d}, {i}, {v})", (i, v))
    if form == "index_fill":
        i = g.index(ids)
        return _emit_bad(g, f"bad_{kind}_index_fill", t, f"{t}.index_fill_({d}, {i}, {g.bad.choice(['0.0', '3.0'])})", (i,))
    ishape = [g.bad.randint(1, n) for n in s]  # scatter_, scatter_add_: an index of a shape <= s
    flat = [g.bad.randrange(s[d]) for _ in range(int(torch.tensor(ishape).prod()))]
    flat[0] = _bad_index(g, s[d], kind)
    i = g.add_input("i", f"torch.tensor({torch.tensor(flat).reshape(ishape).tolist()})", "index")
    v = _bad_data(g, ishape)
    return _emit_bad(g, f"bad_{kind}_{form}", t, f"{t}.{form}_({d}, {i}, {v})", (i, v))


def b_negative_index(g, t):
    """A negative index where the op takes none (index_copy_, index_add_, scatter_, scatter_add_)."""
    return b_index_out_of_range(g, t, kind="negative")


def b_short_source(g, t):
    """A source shorter than the write: masked_scatter_ with fewer elements than set mask elements,
    index_copy_ with fewer rows than indices."""
    s = list(g.t(t).shape)
    if g.bad.random() < 0.5:
        m = g.add_input("m", f"_mask({tuple(s)}, {g.bad.randrange(10**4)})", "mask")
        count = int(g.env[m].sum())
        if count == 0:
            return False
        v = _bad_data(g, [count - 1])
        return _emit_bad(g, "bad_short_masked_scatter", t, f"{t}.masked_scatter_({m}, {v})", (m, v))
    d = g.bad.randrange(len(s))
    if s[d] < 2:
        return False
    ids = g.bad.sample(range(s[d]), g.bad.randint(2, s[d]))
    i, v = g.index(ids), _bad_data(g, s[:d] + [len(ids) - 1] + s[d + 1 :])
    return _emit_bad(g, "bad_short_index_copy", t, f"{t}.index_copy_({d}, {i}, {v})", (i, v))


BAD = {"bad_oob": b_index_out_of_range, "bad_negative": b_negative_index, "bad_short": b_short_source}

TABLES = [WRITES, VIEWS, READS, INTERMEDIATES, WHOLE, BIND_INPLACE, BAD]

# ----------------------------------------------------------------------------------------------
# Backends
# ----------------------------------------------------------------------------------------------


_ACCEPTS: dict = {}


def _accepts(kind: str, options: dict) -> bool:
    """Whether this Thunder knows these options: stock passes unknown options through silently, so
    the probe is that a bogus value of each option raises while the real value does not."""
    key = (kind, tuple(sorted(options.items())))
    if key not in _ACCEPTS:
        import thunder
        from thunder.dynamo import ThunderCompiler

        make = (lambda **o: thunder.jit(lambda x: x, **o)) if kind == "jit" else ThunderCompiler

        def raises(**o) -> bool:
            try:
                make(**o)
            except Exception:  # noqa: BLE001 - any rejection will do
                return True
            return False

        _ACCEPTS[key] = all(raises(**{k: "__fuzz_probe__"}) for k in options) and not raises(**options)
    return _ACCEPTS[key]


def fusion_executors(fusion: str) -> list:
    """Thunder's default executors with a fusion executor: Thunder's torch.compile one in front (as
    the benchmark's "+ torch_compile_ex" backend), or the nvFuser stand-in where nvFuser sits on a
    GPU (thunder/tests/nvfuser_standin.py; from this repository's thunder/ on stock)."""
    import thunder

    if fusion == "torch_compile":
        from thunder.executors.torch_compile import torch_compile_ex

        return [torch_compile_ex, *thunder.get_default_executors()]
    from _support import load_overlay_module

    return load_overlay_module("tests.nvfuser_standin").executors_with_standin()


_FUSION_REPRO = {
    "torch_compile": ("from thunder.executors.torch_compile import torch_compile_ex\n",
                      "[torch_compile_ex, *thunder.get_default_executors()]"),
    "standin": ("from thunder.tests.nvfuser_standin import executors_with_standin\n", "executors_with_standin()"),
}


@dataclass
class Backend:
    name: str
    kind: str  # "jit" or "thunderfx"
    options: dict = field(default_factory=dict)
    needs_option: bool = False  # its options are this fix's (stock ignores them: then "n/a")
    fusion: str | None = None  # "torch_compile" or "standin": that fusion executor (see fusion_executors)
    dynamic: bool | None = None  # torch.compile(dynamic=...)
    grad: bool = False  # inputs require grad; gradients are compared too

    @property
    def inductor(self) -> bool:
        """Inductor computes some values: compared with a tolerance (Inductor is not bitwise)."""
        return self.fusion == "torch_compile" or self.options.get("inplace_indexed_writes") == "inductor"

    def available(self) -> bool:
        return not self.needs_option or _accepts(self.kind, self.options)

    def compile(self, fn: Callable) -> Callable:
        options = dict(self.options)
        if self.fusion:
            options["executors"] = fusion_executors(self.fusion)
        if self.kind == "jit":
            import thunder

            return thunder.jit(fn, **options)
        from thunder.dynamo import ThunderCompiler

        torch._dynamo.reset()
        return torch.compile(fn, backend=ThunderCompiler(**options), fullgraph=False, dynamic=self.dynamic)

    @property
    def imports(self) -> str:
        return _FUSION_REPRO[self.fusion][0] if self.fusion else ""

    @property
    def repro(self) -> str:
        opts = [f"{k}={v!r}" for k, v in self.options.items()]
        if self.fusion:
            opts.append(f"executors={_FUSION_REPRO[self.fusion][1]}")
        if self.kind == "jit":
            return f"thunder.jit({', '.join(['fn', *opts])})"
        dynamic = f", dynamic={self.dynamic}" if self.dynamic is not None else ""
        return f"torch.compile(fn, backend=ThunderCompiler({', '.join(opts)}), fullgraph=False{dynamic})"


BACKENDS = {
    b.name: b
    for b in [
        Backend("jit", "jit"),  # default fusion_type "consecutive"
        Backend("jit_dataflow", "jit", {"fusion_type": "dataflow"}),
        Backend("jit_functional", "jit", {"inplace_indexed_writes": "functional"}, needs_option=True),
        Backend("jit_symbolic", "jit", {"cache": "symbolic values"}),
        Backend("jit_standin", "jit", fusion="standin"),  # nvFuser's fusion pass (the CPU stand-in)
        Backend("jit_torch_compile", "jit", fusion="torch_compile"),
        Backend("jit_grad", "jit", grad=True),
        Backend("jit_standin_grad", "jit", fusion="standin", grad=True),
        Backend("jit_torch_compile_grad", "jit", fusion="torch_compile", grad=True),
        Backend("tfx", "thunderfx"),  # default policy ("inplace" patched), fusion_type "dataflow"
        Backend("tfx_consecutive", "thunderfx", {"fusion_type": "consecutive"}),
        Backend("tfx_inductor", "thunderfx", {"inplace_indexed_writes": "inductor"}, needs_option=True),
        Backend("tfx_functional", "thunderfx", {"inplace_indexed_writes": "functional"}, needs_option=True),
        Backend("tfx_standin", "thunderfx", fusion="standin"),
        Backend("tfx_torch_compile", "thunderfx", fusion="torch_compile"),
        Backend("tfx_dynamic", "thunderfx", dynamic=True),
        Backend("tfx_grad", "thunderfx", grad=True),
        Backend("tfx_torch_compile_grad", "thunderfx", fusion="torch_compile", grad=True),
    ]
}
if DEVICE != "cpu":
    # On CUDA Thunder's default executors put nvFuser in front, so every backend without a fusion executor
    # of its own runs nvFuser's fusion pass and kernels; the CPU stand-in for it has nothing to stand in for.
    # nv_enable_scatter lets nvFuser claim the functional index_put and scatter too.
    for name in [b for b in BACKENDS if BACKENDS[b].fusion == "standin"]:
        del BACKENDS[name]
    BACKENDS["jit_nv_scatter"] = Backend("jit_nv_scatter", "jit", {"nv_enable_scatter": True})
    BACKENDS["tfx_nv_scatter"] = Backend("tfx_nv_scatter", "thunderfx", {"nv_enable_scatter": True})

# ----------------------------------------------------------------------------------------------
# Running and comparing
# ----------------------------------------------------------------------------------------------

OUTCOMES = ["OK", "UNSUPPORTED", "AS_INDUCTOR", "AS_DYNAMO", "AS_SAVED_COPY", "MISMATCH", "CRASH", "REGRESSION", "n/a"]
# Stock-vs-patched: the backend stock runs for one that takes this fix's options (stock has none): the
# default path a user of stock would take.
STOCK_EQUIVALENT = {"jit_functional": "jit", "tfx_inductor": "tfx", "tfx_functional": "tfx"}
_NOT_SUPPORTED = re.compile(r"\bnot (yet )?supported\b|\bnot implemented\b|\bno (torch )?implementation\b", re.I)


@dataclass
class Outcome:
    seed: int
    backend: str
    category: str
    detail: str = ""  # error message or what differs
    patched_signature: str = ""  # REGRESSION: the signature of the patched outcome (for shrinking)

    @property
    def signature(self) -> str:
        """For deduplication. A crash: its message with numbers, shapes and names blurred. A wrong
        value: only where it shows (an input or a returned value, first or second call); which
        programs go wrong the same way shows after shrinking (see `shrink`)."""
        if self.category == "MISMATCH":
            head = self.detail.split(" ", 1)[0]
            where = {"input": "an input", "gradient": "a gradient", "raised": "the error kind",
                     "returned": "a returned value", "grad": "the grad mode"}.get(head, "a returned value")
            if self.detail.startswith("returned normally"):
                where = "no error where eager raises"
            return f"MISMATCH: {where} differs from eager ({self.detail.rsplit('(', 1)[-1]}"
        if self.category == "REGRESSION":
            return f"REGRESSION: stock right, patched {self.detail.split(':', 1)[0]}"
        text = re.sub(r"\b(t|r|s|x|y|v|i|m)\d+\b", "<var>", self.detail.splitlines()[0] if self.detail else "")
        text = re.sub(r"\(\d+(, \d+)*,?\)", "(..)", text)
        text = re.sub(r"\d+", "N", text)
        return f"{self.category}: {text[:160]}"


def _exception_chain(e: BaseException) -> list[BaseException]:
    chain, seen = [], set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        chain.append(e)
        e = getattr(e, "inner_exception", None) or e.__cause__ or e.__context__
    return chain


def classify_exception(e: BaseException, backend: Backend) -> tuple[str, str]:
    chain = _exception_chain(e)
    root = chain[-1]
    msg = f"{type(root).__name__}: {str(root).strip()}"
    unsupported = any(isinstance(x, NotImplementedError) or _NOT_SUPPORTED.search(str(x)) for x in chain)
    # Under thunder.jit a clear "not supported" is acceptable; ThunderFX must fall back instead.
    if unsupported and backend.kind == "jit":
        return "UNSUPPORTED", msg
    where = "".join(traceback.format_list(traceback.extract_tb(root.__traceback__)[-1:])).strip().replace("\n", " ")
    return "CRASH", f"{msg[:600]}  [at {where[:300]}]"


def _tolerances(dtype: torch.dtype) -> dict:
    return {"rtol": 1.6e-2, "atol": 1e-2} if dtype in (torch.bfloat16, torch.float16) else {"rtol": 1e-6, "atol": 1e-6}


def _same(ref, got, tolerant: bool) -> str | None:
    """None when equal, else what differs."""
    if isinstance(ref, torch.Tensor) != isinstance(got, torch.Tensor):
        return f"type {type(ref).__name__} vs {type(got).__name__}"
    if not isinstance(ref, torch.Tensor):
        return None if ref == got else f"{ref!r} vs {got!r}"
    if ref.shape != got.shape or ref.dtype != got.dtype:
        return f"shape/dtype {tuple(ref.shape)} {ref.dtype} vs {tuple(got.shape)} {got.dtype}"
    if torch.equal(ref, got) or (tolerant and torch.allclose(ref, got, **_tolerances(ref.dtype), equal_nan=True)):
        return None
    diff = (ref.double() - got.double()).abs()
    where = tuple(int(k) for k in torch.nonzero(diff != 0)[0]) if diff.ndim else ()
    return f"max |diff| {diff.max().item():.4g}; first at {where}: eager {ref[where].item()!r} got {got[where].item()!r}"


def _as_tuple(out) -> tuple:
    return out if isinstance(out, tuple) else (out,)


@dataclass
class Observed:
    """One call: the arguments after it, and what it returned (and the gradients) or raised."""

    inputs: list
    out: object = None
    error: BaseException | None = None
    leaves: dict = field(default_factory=dict)
    grads: list | None = None
    grad_mode_after: bool = True  # torch.is_grad_enabled() right after the call


def observe(program: Program, fn: Callable, grad: bool, catch: bool) -> Observed:
    """fn on fresh inputs (leaves requiring grad under grad backends, then the gradients of
    _loss); catch: an exception is the observation, not raised."""
    inputs, leaves = program.make_inputs(grad)
    grad_mode = torch.is_grad_enabled()
    try:
        try:
            out = fn(*inputs)
        finally:
            # A call that leaves grad mode changed (a cache hit that skips a no_grad region's exit) is an outcome
            #   of its own; it is restored so that it cannot leak into the gradients below or the next program.
            grad_mode_after = torch.is_grad_enabled()
            torch._C._set_grad_enabled(grad_mode)
        grads = HELPERS["_grads"](out, inputs, leaves) if grad else None
    except Exception as e:  # noqa: BLE001 - eager's exceptions are expected outcomes
        if not catch:
            raise
        return Observed(inputs, error=e, leaves=leaves, grad_mode_after=grad_mode_after)
    return Observed(inputs, out, None, leaves, grads, grad_mode_after)


def _error_text(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e).strip().splitlines()[0][:200] if str(e).strip() else ''}"


def compare(program: Program, ref: Observed, got: Observed, tolerant: bool = False) -> str | None:
    """None when got is eager's outcome, else what differs. Eager raised: got must raise the same
    exception type (anywhere in its chain) and leave the inputs as eager did, or unchanged."""
    names = [i.name for i in program.arg_inputs()]
    tolerant = tolerant or program.tolerant
    if got.grad_mode_after != ref.grad_mode_after:
        return f"grad mode after the call is {got.grad_mode_after}, eager leaves it {ref.grad_mode_after}"
    if ref.error is not None:
        if got.error is None:
            return f"returned normally; eager raised {_error_text(ref.error)}"
        if not any(type(x) is type(ref.error) for x in _exception_chain(got.error)):
            return f"raised {_error_text(_exception_chain(got.error)[-1])}; eager raised {_error_text(ref.error)}"
        originals, _ = program.make_inputs()
        for name, a, b, o in zip(names, ref.inputs, got.inputs, originals):
            d = _same(a.detach(), b.detach(), tolerant)
            if d and _same(o, b.detach(), tolerant):
                return f"input {name} after the error: {d}"
        return None
    for name, a, b in zip(names, ref.inputs, got.inputs):
        d = _same(a.detach(), b.detach(), tolerant)
        if d:
            return f"input {name} after the call: {d}"
    ref_out, got_out = _as_tuple(ref.out), _as_tuple(got.out)
    if len(ref_out) != len(got_out):
        return f"returned {len(got_out)} values, eager {len(ref_out)}"
    tolerant_returns = program.tolerant_returns()
    for name, a, b in zip(program.returns() or ["None"], ref_out, got_out):
        d = _same(_detached(a), _detached(b), tolerant or name in tolerant_returns)
        if d:
            return f"returned {name}: {d}"
    for (name, leaf), a, b in zip(ref.leaves.items(), ref.grads or (), got.grads or ()):
        zero = torch.zeros_like(leaf)
        d = _same(zero if a is None else a, zero if b is None else b, True)
        if d:
            return f"gradient of {name}: {d}"
    return None


def _detached(x):
    return x.detach() if isinstance(x, torch.Tensor) else x


def _behaves_as_inductor(program: Program, got: Observed) -> bool:
    """Whether plain torch.compile (Inductor) does on ``program`` what ``got`` did: raises the same exception
    type, or returns and leaves the same values (Inductor accepts some indices eager rejects, such as -4 for
    ``index_copy_``). Only asked where a backend routes writes to Inductor."""
    torch._dynamo.reset()
    try:
        inductor = observe(program, torch.compile(program.function(), backend="inductor"), False, catch=True)
    finally:
        torch._dynamo.reset()
    if inductor.error is not None or got.error is not None:
        return inductor.error is not None and type(inductor.error) is type(got.error)
    return not compare(program, inductor, got, True)


def _raises_as_dynamo(program: Program, got: Observed, grad: bool) -> bool:
    """Whether Dynamo with no compiler behind it (backend="eager") raises the exception type ``got`` raised:
    then the error is Dynamo's graph capture, the same under every torch.compile backend, not Thunder's."""
    torch._dynamo.reset()
    try:
        dynamo = observe(program, torch.compile(program.function(), backend="eager"), grad, catch=True)
    finally:
        torch._dynamo.reset()
    return dynamo.error is not None and got.error is not None and type(dynamo.error) is type(got.error)


def _refuses_a_backward_over_a_written_saved_tensor(ref: Observed) -> bool:
    return isinstance(ref.error, RuntimeError) and "modified by an inplace operation" in str(ref.error)


def _as_eager_saving_copies(program: Program, got: Observed, tolerant: bool) -> bool:
    """Whether ``got`` is what eager computes when it saves copies of the tensors its backward needs
    (``allow_mutation_on_saved_tensors``): asked only where eager's own backward refused a written saved
    tensor and the backend returned."""
    with torch.autograd.graph.allow_mutation_on_saved_tensors():
        copying = observe(program, program.function(), True, catch=True)
    return copying.error is None and not compare(program, copying, got, tolerant)


def run_eager(program: Program, grad: bool = False) -> Observed:
    return observe(program, program.function(), grad, catch=True)


def run_backend(program: Program, backend: Backend, eager: Observed | None = None) -> Outcome:
    if not backend.available():
        return Outcome(program.seed, backend.name, "n/a")
    ref = eager or run_eager(program, backend.grad)
    try:
        compiled = backend.compile(program.function())
        for call in ("first call", "second call"):
            got = observe(program, compiled, backend.grad, catch=ref.error is not None)
            diff = compare(program, ref, got, backend.inductor)
            if diff and got.error is not None and diff.startswith("raised"):
                category, detail = classify_exception(got.error, backend)
                if category == "UNSUPPORTED":
                    return Outcome(program.seed, backend.name, category, detail)
                if backend.kind == "thunderfx" and _raises_as_dynamo(program, got, backend.grad):
                    return Outcome(program.seed, backend.name, "AS_DYNAMO", f"{diff} ({call})")
            if (
                diff
                and backend.options.get("inplace_indexed_writes") == "inductor"
                and _behaves_as_inductor(program, got)
            ):
                # A backend that gives writes to Inductor by design (the "inductor" option) gets Inductor's
                # bounds checks: counted apart, named in the docs' limits, not taken for eager's outcome.
                return Outcome(program.seed, backend.name, "AS_INDUCTOR", f"{diff} ({call})")
            if (
                diff
                and backend.grad
                and got.error is None
                and _refuses_a_backward_over_a_written_saved_tensor(ref)
                and _as_eager_saving_copies(program, got, backend.inductor)
            ):
                return Outcome(program.seed, backend.name, "AS_SAVED_COPY", f"{diff} ({call})")
            if diff:
                return Outcome(program.seed, backend.name, "MISMATCH", f"{diff} ({call})")
    except Exception as e:  # noqa: BLE001 - every exception is an outcome here
        return Outcome(program.seed, backend.name, *classify_exception(e, backend))
    finally:
        if backend.kind == "thunderfx":
            torch._dynamo.reset()
    return Outcome(program.seed, backend.name, "OK")


# ----------------------------------------------------------------------------------------------
# Shrinking: drop lines while the same failure persists
# ----------------------------------------------------------------------------------------------


def _without(program: Program, drop: int) -> Program:
    """The program without line `drop` and every line depending on what it defines."""
    gone, stmts = set(), []
    for k, s in enumerate(program.stmts):
        if k == drop or gone & set(s.uses):
            if s.defines:
                gone.add(s.defines)
            continue
        stmts.append(s)
    return Program(program.seed, program.inputs, stmts, [n for n in program.extra_returns if n not in gone])


def _unbound(program: Program, k: int) -> Program:
    """`y = t.op_(...)` as `t.op_(...)`, later uses of y naming t instead."""
    s = program.stmts[k]
    rename = lambda text: re.sub(rf"\b{s.defines}\b", s.alias_of, text)  # noqa: E731
    stmts = program.stmts[:k] + [Stmt(s.kind, s.code.split(" = ", 1)[1], s.uses)]
    for later in program.stmts[k + 1 :]:
        stmts.append(Stmt(later.kind, rename(later.code), tuple(rename(u) for u in later.uses), later.defines,
                          later.returned, later.tolerant, later.alias_of and rename(later.alias_of)))
    return Program(program.seed, program.inputs, stmts, [rename(n) for n in program.extra_returns])


def _smaller(program: Program):
    """Candidate simplifications, last lines first: drop a line (and its dependents), unbind."""
    for k in reversed(range(len(program.stmts))):
        yield _without(program, k)
        if program.stmts[k].alias_of:
            yield _unbound(program, k)


def shrink(program: Program, failure: Outcome, budget_s: float = 60.0) -> Program:
    """A smaller program failing the same way (same backend, same signature), within budget_s."""
    backend, deadline = BACKENDS[failure.backend], time.monotonic() + budget_s
    signature = failure.patched_signature or failure.signature
    changed = True
    while changed and time.monotonic() < deadline:
        changed = False
        for candidate in _smaller(program):
            if not candidate.stmts or time.monotonic() > deadline:
                continue
            try:
                eager = run_eager(candidate, backend.grad)
            except Exception:  # noqa: BLE001 - the smaller program is not valid on its own
                continue
            if eager.error is not None and not candidate.expects_error:
                continue  # eager rejects it, and not at a bad line of ours: not valid on its own
            if run_backend(candidate, backend, eager).signature == signature:
                program, changed = candidate, True
                break
    return program


# ----------------------------------------------------------------------------------------------
# Campaigns and their summary
# ----------------------------------------------------------------------------------------------


@dataclass
class Campaign:
    outcomes: list[Outcome] = field(default_factory=list)
    programs: dict[int, Program] = field(default_factory=dict)
    seconds: float = 0.0
    exclude: frozenset[str] = frozenset()  # ops not to generate
    stock: dict = field(default_factory=dict)  # (seed, backend) -> stock's category (add_stock)

    def run(self, plan, log=None, seconds: float | None = None):
        """plan: (seed, backend names) pairs; each seed's program runs under its backends. seconds: start
        no program after that long (the programs run so far are the campaign)."""
        start = time.monotonic()
        for seed, backends in plan:
            if seconds is not None and time.monotonic() - start > seconds:
                break
            program = generate(seed, self.exclude)
            self.programs[seed] = program
            eager = {}  # grad -> eager's observation
            for name in backends:
                grad = BACKENDS[name].grad
                if grad not in eager:
                    eager[grad] = run_eager(program, grad)
                outcome = run_backend(program, BACKENDS[name], eager[grad])
                self.outcomes.append(outcome)
                if log and outcome.category not in ("OK", "n/a"):
                    log(f"seed {seed} {name}: {outcome.category}: {outcome.detail.splitlines()[0][:200]}")
        self.seconds += time.monotonic() - start
        return self

    @property
    def failures(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.category in ("MISMATCH", "CRASH", "REGRESSION")]

    def not_ok(self) -> list[tuple[int, list[str]]]:
        """The plan of the runs that were not OK, in stock's backends (STOCK_EQUIVALENT): all stock
        needs to run to find the regressions."""
        plan: dict[int, list[str]] = defaultdict(list)
        for o in self.outcomes:
            if o.category in ("MISMATCH", "CRASH", "UNSUPPORTED"):
                name = STOCK_EQUIVALENT.get(o.backend, o.backend)
                if name not in plan[o.seed]:
                    plan[o.seed].append(name)
        return sorted(plan.items())

    def stock_outcome(self, o: Outcome) -> str | None:
        return self.stock.get((o.seed, STOCK_EQUIVALENT.get(o.backend, o.backend)))

    @property
    def stock_shared(self) -> list[Outcome]:
        """Failures stock has too: stock's outcome of the program under the same backend is also
        wrong (MISMATCH or CRASH). Known stock bugs: the fast profile lets them pass, the slow one not."""
        wrong = ("MISMATCH", "CRASH")
        return [o for o in self.failures if o.category != "REGRESSION" and self.stock_outcome(o) in wrong]

    @property
    def new_failures(self) -> list[Outcome]:
        """Failures that stock does not share (regressions included)."""
        shared = {id(o) for o in self.stock_shared}
        return [o for o in self.failures if id(o) not in shared]

    def add_stock(self, stock: dict[tuple[int, str], str]):
        """Stock-vs-patched: each patched MISMATCH, CRASH or UNSUPPORTED of a program that stock ran
        right (OK) under the same backend is also a REGRESSION, a failure of its own kind."""
        self.stock.update(stock)
        for o in list(self.outcomes):
            if o.category in ("MISMATCH", "CRASH", "UNSUPPORTED") and self.stock_outcome(o) == "OK":
                self.outcomes.append(
                    Outcome(o.seed, o.backend, "REGRESSION", f"{o.category}: {o.detail}", patched_signature=o.signature)
                )

    def counts(self) -> dict[str, dict[str, int]]:
        table: dict[str, Counter] = defaultdict(Counter)
        for o in self.outcomes:
            table[o.backend][o.category] += 1
        return {b: {c: table[b][c] for c in OUTCOMES if table[b][c]} for b in table}

    def kinds(self) -> dict[str, list[Outcome]]:
        """Distinct failures: signature (backend-independent) -> outcomes. Wrong values first, then
        ThunderFX crashes, then the rest; more frequent first."""
        groups: dict[str, list[Outcome]] = defaultdict(list)
        for o in self.failures:
            groups[o.signature].append(o)

        def rank(item):
            sig, group = item
            tfx = any(BACKENDS[o.backend].kind == "thunderfx" for o in group)
            return (not sig.startswith("MISMATCH"), not tfx, -len(group))

        return dict(sorted(groups.items(), key=rank))

    def table(self) -> str:
        """Per backend: programs, each outcome, REGRESSION (stock right, patched not; only after
        add_stock) and STOCK_TOO (failures stock has as well)."""
        counts, shared = self.counts(), Counter(o.backend for o in self.stock_shared)
        lines = [f"{'backend':<20}{'programs':>9}" + "".join(f"{c:>14}" for c in [*OUTCOMES, "STOCK_TOO"])]
        for b, c in counts.items():
            n = sum(v for k, v in c.items() if k != "REGRESSION")
            lines.append(f"{b:<20}{n:>9}" + "".join(f"{c.get(k, 0):>14}" for k in OUTCOMES) + f"{shared[b]:>14}")
        return "\n".join(lines)

    def summary(self, max_repros: int = 5, shrink_budget_s: float = 60.0) -> str:
        """Counts, distinct failure kinds, and up to max_repros shrunk repros (shrink_budget_s each)."""
        import thunder

        fails = self.failures
        by_cat = Counter(o.category for o in fails)
        lines = [
            f"thunder {thunder.__version__} from {Path(thunder.__file__).parent}; "
            f"PYTHONHASHSEED={os.environ.get('PYTHONHASHSEED', 'random')} (some failures depend on it)",
            f"{len(self.programs)} programs, {len(self.outcomes)} runs, {self.seconds:.0f} s; "
            f"failures: {len(fails)} ({', '.join(f'{k} {v}' for k, v in by_cat.items()) or 'none'})",
            self.table(),
        ]
        kinds = self.kinds()
        if kinds:
            lines.append(f"\n{len(kinds)} distinct failure kinds:")
            for sig, group in kinds.items():
                backends = sorted({o.backend for o in group})
                lines.append(f"  [{len(group)}x; {', '.join(backends)}; seeds {sorted({o.seed for o in group})[:8]}] {sig}")
        for failure in self.examples(max_repros):
            small = shrink(self.programs[failure.seed], failure, shrink_budget_s)
            lines += [
                f"\n--- repro (shrunk): {failure.backend}, seed {failure.seed}: {failure.detail.splitlines()[0][:400]}",
                small.repro(failure.backend),
            ]
        return "\n".join(lines)

    def examples(self, n: int) -> list[Outcome]:
        """Up to n failures to show: the smallest program of each kind, in kind order; then, while
        slots remain, more wrong values from other programs (their kind is coarse)."""
        picked, seeds = [], set()
        size = lambda o: len(self.programs[o.seed].stmts)  # noqa: E731
        for group in self.kinds().values():
            first = min(group, key=size)
            if first.seed not in seeds:
                picked.append(first)
                seeds.add(first.seed)
        for o in sorted((o for o in self.failures if o.category == "MISMATCH"), key=size):
            if o.seed not in seeds:
                picked.append(o)
                seeds.add(o.seed)
        return picked[:n]

    def to_json(self) -> dict:
        import thunder

        return {
            "thunder": str(Path(thunder.__file__).parent),
            "programs": len(self.programs),
            "runs": len(self.outcomes),
            "seconds": round(self.seconds, 1),
            "counts": self.counts(),
            "failure_kinds": [
                {"signature": sig, "count": len(g), "backends": sorted({o.backend for o in g}), "seeds": sorted({o.seed for o in g})[:20]}
                for sig, g in self.kinds().items()
            ],
            "failures": [{"seed": o.seed, "backend": o.backend, "category": o.category, "detail": o.detail} for o in self.failures],
            "outcomes": [[o.seed, o.backend, o.category] for o in self.outcomes],
        }


def run_on_stock(plan: list[tuple[int, list[str]]], exclude: frozenset[str] = frozenset()) -> dict[tuple[int, str], str]:
    """The same plan on the pristine base, in a child process (scripts/python-stock runs this file
    there): (seed, backend) -> outcome category. The child gets this process's PYTHONHASHSEED (0
    if it is random here), so the set and dict orders inside Thunder match a standalone run's."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        plan_file, out = Path(tmp) / "plan.json", Path(tmp) / "stock.json"
        plan_file.write_text(json.dumps([[s, list(b)] for s, b in plan]))
        env = dict(os.environ, PYTHONHASHSEED=os.environ.get("PYTHONHASHSEED", "0"))
        # python-stock puts the pristine base first; the patched tree goes, other entries (packages carried to a
        # device machine) stay
        kept = [e for e in env.get("PYTHONPATH", "").split(os.pathsep) if e and Path(e).name not in PATCHED_TREES]
        env["PYTHONPATH"] = os.pathsep.join(kept)
        cmd = [str(REPO / "scripts" / "python-stock"), "-W", "ignore", __file__, "--plan", str(plan_file),
               "--json", str(out), "--repros", "0", "--exclude", ",".join(sorted(exclude))]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if not out.exists():
            raise RuntimeError(f"the stock run failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        data = json.loads(out.read_text())["standalone"]
    return {(seed, backend): category for seed, backend, category in data["outcomes"]}


def add_stock_outcomes(campaign: Campaign) -> Campaign:
    """Stock-vs-patched for the runs that were not OK (stock runs them in a child process)."""
    plan = campaign.not_ok()
    if plan:
        campaign.add_stock(run_on_stock(plan, campaign.exclude))
    return campaign


def write_json(name: str, campaign: Campaign, path: Path = SUMMARY_JSON):
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        data = {}
    data[name] = campaign.to_json()
    path.write_text(json.dumps(data, indent=1, sort_keys=True))


# ----------------------------------------------------------------------------------------------
# pytest
# ----------------------------------------------------------------------------------------------

JIT_BACKENDS = [b for b in BACKENDS if BACKENDS[b].kind == "jit"]
TFX_BACKENDS = [b for b in BACKENDS if BACKENDS[b].kind == "thunderfx"]


def fast_plan(seeds) -> list[tuple[int, list[str]]]:
    """Each program under jit and two more backends, round robin over the others (every backend runs)."""
    others = [b for b in BACKENDS if b != "jit"]
    return [(s, ["jit", others[(2 * s) % len(others)], others[(2 * s + 1) % len(others)]]) for s in seeds]


FAST_CHUNKS = [range(k, k + 8) for k in range(0, 16, 8)]  # 16 programs, 48 runs, under 2 min with stock
SLOW_PROGRAMS = int(os.environ.get("FUZZ_PROGRAMS", "2000"))
SLOW_SEED_BASE = 100_000
SHRINK_S = float(os.environ.get("FUZZ_SHRINK_S", "4"))  # seconds to shrink each repro in a failing test
STOCK = os.environ.get("FUZZ_STOCK", "1") != "0"  # stock-vs-patched (scripts/python-stock); 0: off


def _check(campaign: Campaign, name: str, strict: bool):
    """Fails on regressions (stock right, patched wrong), on failures stock does not share and, when
    strict, on every failure (the slow profile: stock's bugs count too)."""
    # on stock itself (no inplace_indexed_writes option: `make stock-fails`) every failure counts
    stock_here = not BACKENDS["jit_functional"].available()
    if STOCK and not stock_here:
        add_stock_outcomes(campaign)
    print(f"\n{name}: per-backend outcomes\n{campaign.table()}")
    write_json(name, campaign)
    failures = campaign.failures if strict or not STOCK or stock_here else campaign.new_failures
    summary = campaign.summary(shrink_budget_s=SHRINK_S) if failures else ""
    assert not failures, f"{name}\n{summary}"


@pytest.mark.claims_fix
@pytest.mark.parametrize("seeds", FAST_CHUNKS, ids=lambda r: f"seeds{r.start}-{r.stop - 1}")
def test_fuzz_fast(seeds, caplog):
    """Each program of the chunk equals eager, or fails as it does on stock, under its backends."""
    caplog.set_level(logging.WARNING, logger="torch.__trace")  # Dynamo's structured trace: thousands of DEBUG lines
    _check(Campaign().run(fast_plan(seeds)), f"fast[seeds{seeds.start}-{seeds.stop - 1}]", strict=False)


@pytest.mark.slow
@pytest.mark.claims_fix
@pytest.mark.parametrize("backend", list(BACKENDS))
def test_fuzz_slow(backend, caplog):
    """FUZZ_PROGRAMS (default 2,000) distinct programs in all, each under one backend (round robin);
    every mismatch and crash fails, stock's too."""
    caplog.set_level(logging.WARNING, logger="torch.__trace")
    k, n = list(BACKENDS).index(backend), len(BACKENDS)
    if not BACKENDS[backend].available():
        pytest.skip(f"{backend}: this Thunder has no inplace_indexed_writes option")
    seeds = range(SLOW_SEED_BASE + k, SLOW_SEED_BASE + SLOW_PROGRAMS, n)
    _check(Campaign().run((s, [backend]) for s in seeds), f"slow[{backend}]", strict=True)


# ----------------------------------------------------------------------------------------------
# Standalone
# ----------------------------------------------------------------------------------------------


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--programs", type=int, default=50)
    p.add_argument("--seed", type=int, default=0, help="first seed")
    p.add_argument("--backends", default=",".join(BACKENDS), help=f"comma-separated, of {', '.join(BACKENDS)}")
    p.add_argument("--spread", action="store_true", help="run each program under one backend (round robin), not all")
    p.add_argument("--repros", type=int, default=5, help="shrunk repros to print (one per distinct failure kind)")
    p.add_argument("--shrink-budget", type=float, default=60.0, help="seconds per shrunk repro")
    p.add_argument("--json", type=Path, default=SUMMARY_JSON)
    p.add_argument("--forms", default="", help=f"comma-separated extra write forms to draw, of {', '.join(EXTRA_FORMS)}")
    p.add_argument("--exclude", default="", help="comma-separated ops not to generate (e.g. index_fill,scatter_reduce,masked_scatter)")
    p.add_argument("--show", type=int, nargs="*", help="print the programs of these seeds and exit")
    p.add_argument("--stock", action="store_true",
                   help="stock-vs-patched: run the plan on stock too (child process); a program stock runs "
                   "right and this build does not is a REGRESSION")
    p.add_argument("--plan", type=Path, help="JSON [[seed, [backends]], ...] to run instead of --programs/--seed")
    p.add_argument("--seconds", type=float, help="start no program after this many seconds")
    p.add_argument("-v", "--verbose", action="store_true", help="print each failure as it happens")
    args = p.parse_args(argv)
    exclude = frozenset(x.strip() for x in args.exclude.split(",") if x.strip())
    if args.forms:
        os.environ["FUZZ_FORMS"] = args.forms  # read by the generator here and in the stock child
    if exclude - {op for table in TABLES for op in table}:
        p.error(f"unknown ops {sorted(exclude - {op for table in TABLES for op in table})}")
    if args.show is not None:
        for s in args.show:
            print(generate(s, exclude).repro())
        return 0
    names = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = set(names) - set(BACKENDS)
    if unknown:
        p.error(f"unknown backends {sorted(unknown)}")
    campaign = Campaign(exclude=exclude)
    log = (lambda s: print(s, flush=True)) if args.verbose else None
    seeds = range(args.seed, args.seed + args.programs)
    if args.plan:
        plan = [(s, b) for s, b in json.loads(args.plan.read_text())]
    elif args.spread:
        plan = [(s, [names[k % len(names)]]) for k, s in enumerate(seeds)]
    else:
        plan = [(s, names) for s in seeds]
    campaign.run(plan, log, args.seconds)
    if args.stock:  # stock runs what was not OK here: that is where regressions can be
        add_stock_outcomes(campaign)
    print(campaign.summary(args.repros, args.shrink_budget))
    write_json("standalone", campaign, args.json)
    return 1 if campaign.failures else 0


if __name__ == "__main__":
    import warnings

    # Some outcomes depend on set/dict iteration order inside Thunder: fix the hash seed (rerun
    # with PYTHONHASHSEED=k to try others) so that a run, and its repros, reproduce.
    if "PYTHONHASHSEED" not in os.environ:
        os.environ["PYTHONHASHSEED"] = "0"
        os.execv(sys.executable, [sys.executable, *sys.argv])
    warnings.filterwarnings("ignore")
    sys.exit(main())
