"""Find full-size copies of input tensors in a Thunder execution trace.

An in-place indexed write such as ``buf[idx] = v`` should move only the written elements. Thunder's
functional lowering of such writes instead shows up in the execution trace as a full-size op on the
input, e.g. for ``buf[loc] = k``::

    (t6,) = update_aliases((buf,))
    t7 = copy_with_setitem_impl(t6, loc, k)   # clone of all of buf, then one row set
    t8 = copy_(t7, t6, grad_enabled=True)     # all of buf copied back

:func:`find_full_size_copies` reports both lines. Use it in tests ("this trace moves no full-size
copy of an input") and when profiling ("which ops copy my KV cache?").

What is reported, for a tensor that is a trace input or an alias or view of one:

* ``clone``: a clone of it;
* ``copy_with_setitem``: the functional setitem, which clones it;
* ``functional <op>``: a functional ``index_copy``, ``index_put``, ``index_add``, ``index_fill``,
  ``scatter``, ``scatter_add``, ``masked_fill`` or ``masked_scatter`` of it whose result is copied
  back into it with ``copy_``;
* ``copy_``: a ``copy_`` that writes the result of one of the above back over all of it.

Fusion regions are searched inside. In-place ops that write only the indexed elements are not
reported, and neither are whole-tensor in-place ops such as ``add_`` (Thunder's ``add`` + ``copy_``):
eager writes every element of the destination for those too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from thunder.core.proxies import TensorProxy
from thunder.core.pytree import tree_flatten

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator
    from thunder.core.symbol import BoundSymbol
    from thunder.core.trace import TraceCtx

__all__ = [
    "FullSizeCopy",
    "LargeTensor",
    "eager_large_tensors",
    "find_large_tensors",
    "find_full_size_copies",
    "full_size_copy_bytes",
    "peak_memory_growth",
    "thunderfx_execution_traces",
]

_CLONE_NAMES = frozenset({"clone"})
_SETITEM_COPY_NAMES = frozenset({"copy_with_setitem", "copy_with_setitem_impl"})
_FUNCTIONAL_INDEXED_NAMES = frozenset(
    {"index_copy", "index_put", "index_add", "index_fill", "scatter", "scatter_add", "masked_fill", "masked_scatter"}
)
_COPY_NAMES = frozenset({"copy_"})
_ALIAS_NAMES = frozenset({"update_aliases"})


@dataclass(frozen=True)
class FullSizeCopy:
    """One full-size op on (an alias or view of) the trace input ``input_name``."""

    kind: str
    input_name: str
    line: str
    shape: tuple[int, ...]
    nbytes: int

    def __str__(self) -> str:
        return f"{self.kind} of {self.input_name} {list(self.shape)} ({self.nbytes} bytes): {self.line}"


def _tensors(values) -> list[TensorProxy]:
    flat, _ = tree_flatten(values)
    return [v for v in flat if isinstance(v, TensorProxy)]


def _nbytes(t: TensorProxy) -> int:
    numel = 1
    for s in t.shape:
        numel *= int(s)
    return numel * t.dtype.bytes


def _line(bsym: BoundSymbol) -> str:
    # The bsym's own line; the lines below it are its decomposition, printed as comments.
    lines = [ln.strip() for ln in str(bsym).splitlines() if ln.strip()]
    return next((ln for ln in lines if not ln.startswith("#")), lines[0] if lines else "")


def _is_view_op(bsym: BoundSymbol) -> bool:
    import thunder.torch as ltorch

    if bsym.sym in ltorch._syms_returning_views or bsym.sym in ltorch._syms_that_may_return_views:
        return True
    # An executor's symbol (e.g. torchex's `Tensor.__getitem__`, `torch.split`) keeps the ltorch op it
    # implements as its only subsymbol, with the same outputs (a tuple of them for split/chunk/unbind).
    if len(bsym.subsymbols) == 1 and _same_outputs(bsym.subsymbols[0], bsym):
        return _is_view_op(bsym.subsymbols[0])
    return False


def _same_outputs(a: BoundSymbol, b: BoundSymbol) -> bool:
    if a.output is b.output:
        return True
    a_outs, b_outs = _tensors(a.output), _tensors(b.output)
    return bool(a_outs) and [t.name for t in a_outs] == [t.name for t in b_outs]


def _walk(bsyms: Iterable[BoundSymbol], in_fusion: bool = False) -> Iterator[BoundSymbol]:
    for bsym in bsyms:
        if bsym.sym.is_fusion:
            yield from _walk(bsym.subsymbols, in_fusion=True)
        elif in_fusion and bsym.subsymbols and not bsym.sym.is_prim:
            # A fusion region may hold composite ops (e.g. ltorch.setitem_); what runs is their decomposition.
            yield from _walk(bsym.subsymbols, in_fusion=True)
        else:
            yield bsym


def find_full_size_copies(trace: TraceCtx) -> list[FullSizeCopy]:
    """Full-size copies of the trace's input tensors (or of their aliases and views), in trace order."""
    # proxy name -> name of the trace input it aliases
    input_of: dict[str, str] = {t.name: t.name for t in _tensors((trace.args, trace.kwargs))}
    # output name of a functional indexed op on an input -> (its bsym, the input it was applied to)
    pending_functional: dict[str, tuple[BoundSymbol, TensorProxy]] = {}
    # names of full-size copies already reported (clone, copy_with_setitem results)
    full_size_results: set[str] = set()
    found: list[FullSizeCopy] = []

    for bsym in _walk(trace.bound_symbols):
        name = bsym.sym.name
        args = _tensors(bsym.args)
        outs = _tensors(bsym.output)
        first = args[0] if args else None
        aliased = first is not None and first.name in input_of

        if name in _ALIAS_NAMES:
            for a, o in zip(args, outs):
                if a.name in input_of:
                    input_of[o.name] = input_of[a.name]
        elif name in _COPY_NAMES and len(args) >= 2:
            src, dst = args[0], args[1]
            if dst.name in input_of:
                for o in outs:
                    input_of[o.name] = input_of[dst.name]
                copies_back = src.name in full_size_results
                if src.name in pending_functional:
                    fn_bsym, dest = pending_functional.pop(src.name)
                    found.append(
                        FullSizeCopy(
                            f"functional {fn_bsym.sym.name}",
                            input_of[dest.name],
                            _line(fn_bsym),
                            tuple(int(s) for s in dest.shape),
                            _nbytes(dest),
                        )
                    )
                    copies_back = True
                if copies_back and tuple(src.shape) == tuple(dst.shape):
                    found.append(
                        FullSizeCopy(
                            "copy_", input_of[dst.name], _line(bsym), tuple(int(s) for s in dst.shape), _nbytes(dst)
                        )
                    )
        elif aliased and name in _CLONE_NAMES | _SETITEM_COPY_NAMES:
            kind = "clone" if name in _CLONE_NAMES else "copy_with_setitem"
            full_size_results.update(o.name for o in outs)
            found.append(
                FullSizeCopy(
                    kind, input_of[first.name], _line(bsym), tuple(int(s) for s in first.shape), _nbytes(first)
                )
            )
        elif aliased and name in _FUNCTIONAL_INDEXED_NAMES and outs:
            pending_functional[outs[0].name] = (bsym, first)
        elif aliased and _is_view_op(bsym):
            for o in outs:
                input_of[o.name] = input_of[first.name]
        elif aliased and bsym.sym.tags and any(getattr(t, "name", "") == "IN_PLACE" for t in bsym.sym.tags):
            # An in-place op returns (a new proxy for) its destination.
            for o in outs[:1]:
                input_of[o.name] = input_of[first.name]
    return found


@dataclass(frozen=True)
class LargeTensor:
    """A tensor of at least the size asked for that a trace makes from its inputs (new memory, not a view
    and not the destination of an in-place op)."""

    kind: str
    line: str
    shape: tuple[int, ...]
    nbytes: int

    def __str__(self) -> str:
        return f"{self.kind} {list(self.shape)} ({self.nbytes} bytes): {self.line}"


def _numel(t: TensorProxy) -> int:
    numel = 1
    for s in t.shape:
        numel *= int(s)
    return numel


def _writes_in_place(bsym: BoundSymbol) -> bool:
    """Whether ``bsym`` returns (a new proxy for) the tensor it writes, so its result is no new memory."""
    if bsym.sym.name in _COPY_NAMES or any(getattr(t, "name", "") == "IN_PLACE" for t in (bsym.sym.tags or ())):
        return True
    return (
        len(bsym.subsymbols) == 1 and _same_outputs(bsym.subsymbols[0], bsym) and _writes_in_place(bsym.subsymbols[0])
    )


def find_large_tensors(trace: TraceCtx, min_numel: int) -> list[LargeTensor]:
    """Tensors of at least ``min_numel`` elements that ``trace`` makes from its inputs, in trace order.

    In a decode step, pass the size of one cache tensor: what should remain is what the step must make
    (activations are far smaller); a hit is a copy of the cache in some form. Reported:

    * ``materialized broadcast``: an op that lays out a broadcast view of an input, such as the reshape of
      Hugging Face's ``repeat_kv`` (``k[:, :, None].expand(...).reshape(...)``), which copies the cache;
    * ``<op name>``: any other op whose result is that large, e.g. ``clone``, ``to`` (a cast), ``cat``.

    Views (``expand``, slices, reshapes that keep the layout), ``update_aliases`` and the results of
    in-place ops (the destination itself) are not reported. A reshape of a broadcast view that only adds
    or splits dims is assumed to stay a view.
    """
    derived: set[str] = {t.name for t in _tensors((trace.args, trace.kwargs))}
    broadcast: set[str] = set()  # views in which some input element appears more than once
    found: list[LargeTensor] = []
    for bsym in _walk(trace.bound_symbols):
        args, outs = _tensors(bsym.args), _tensors(bsym.output)
        if not any(a.name in derived for a in args):
            continue
        derived.update(o.name for o in outs)
        first = args[0] if args else None
        if bsym.sym.name in _ALIAS_NAMES:  # new names for the same tensors
            broadcast.update(o.name for a, o in zip(args, outs) if a.name in broadcast)
            continue
        if _writes_in_place(bsym):
            continue
        if _is_view_op(bsym):
            for o in outs:
                if first.name in broadcast and o.ndim < first.ndim and _numel(o) >= min_numel:
                    found.append(
                        LargeTensor("materialized broadcast", _line(bsym), tuple(int(s) for s in o.shape), _nbytes(o))
                    )
                elif first.name in broadcast or _numel(o) > _numel(first):
                    broadcast.add(o.name)
            continue
        for o in outs:
            if _numel(o) >= min_numel:
                found.append(LargeTensor(bsym.sym.name, _line(bsym), tuple(int(s) for s in o.shape), _nbytes(o)))
    return found


def eager_large_tensors(fn, /, *args, min_numel: int, **kwargs) -> list[LargeTensor]:
    """The tensors of at least ``min_numel`` elements that eager PyTorch makes in one call
    ``fn(*args, **kwargs)``: the outputs of ATen ops that are not views of their inputs, in call order.

    The reference for :func:`find_large_tensors`: a model's own step may make a tensor of a cache's size
    (DeepSeek-V3 expands its compressed cache with ``kv_b_proj``; a full sliding-window cache rolls), and
    Thunder doing the same is not a copy it adds. Compare counts: Thunder's traces should make no more.
    """
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten as torch_tree_flatten

    found: list[LargeTensor] = []

    class _Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            flat_args = torch_tree_flatten((args, kwargs))[0]
            inputs = {t.untyped_storage().data_ptr() for t in flat_args if isinstance(t, torch.Tensor)}
            for o in torch_tree_flatten(out)[0]:
                if (
                    isinstance(o, torch.Tensor)
                    and o.numel() >= min_numel
                    and o.untyped_storage().data_ptr() not in inputs
                ):
                    name = func.overloadpacket.__name__
                    found.append(LargeTensor(name, str(func), tuple(o.shape), o.numel() * o.element_size()))
            return out

    with _Record():
        fn(*args, **kwargs)
    return found


def full_size_copy_bytes(trace: TraceCtx) -> int:
    """Bytes written by the full-size copies :func:`find_full_size_copies` reports."""
    return sum(c.nbytes for c in find_full_size_copies(trace))


def thunderfx_execution_traces(backend) -> list[TraceCtx]:
    """The last execution trace of every Thunder segment a ``ThunderCompiler`` backend compiled."""
    import thunder

    traces = []
    for info in backend.subgraph_infos:
        for fn in info.thunder_compiled_fns:
            traces.append(thunder.last_traces(fn)[-1])
    return traces


def peak_memory_growth(fn, /, *args, **kwargs) -> int:
    """Bytes by which the peak memory during one call ``fn(*args, **kwargs)`` exceeds the memory in use
    just before it.

    Unlike :func:`find_full_size_copies`, this sees copies made anywhere: in Thunder's traces, in code
    Inductor generates for the segments ThunderFX gives it, in eager fallbacks. Compile ``fn`` (call it
    once) before measuring. On CUDA it reads the caching allocator's peak; on CPU the process's resident
    set high-water mark (Linux: ``/proc/self/status``, reset through ``/proc/self/clear_refs``), which also
    counts a few MiB of allocator and interpreter noise, so compare it with buffers of tens of MiB.
    """
    import torch

    if torch.cuda.is_available() and any(isinstance(a, torch.Tensor) and a.is_cuda for a in args):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        fn(*args, **kwargs)
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - before

    def status_bytes(field: str) -> int:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
        raise RuntimeError(f"{field} not in /proc/self/status")

    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current resident set size
    before = status_bytes("VmRSS")
    fn(*args, **kwargs)
    return status_bytes("VmHWM") - before
