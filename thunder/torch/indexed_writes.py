"""How thunder.torch lowers in-place indexed writes.

PyTorch's in-place indexed writes (``a[key] = v``, ``Tensor.index_copy_``, ``index_add_``, ``index_fill_``,
``index_put_``, ``scatter_``, ``scatter_add_``, ``scatter_reduce_``, ``masked_fill_`` and ``masked_scatter_``)
change only the selected elements of ``a``. ``thunder.torch`` lowers each of them to one of:

- the matching in-place prim (``prims.setitem_``, ``prims.index_copy_``, ...), which writes just those
  elements (compile option ``inplace_indexed_writes="inplace"``, the default, or ``"inductor"``);
- the functional op, which builds an updated copy of all of ``a``, followed by ``prims.copy_`` of that
  copy into ``a`` (``inplace_indexed_writes="functional"``, the lowering of thunder 0.2.6 and earlier).

The functional lowering is also used, whatever the option, when a gradient may flow through the write
(grad mode is on and the destination or a written value may require grad): the in-place prims have no
grad rule. Ops with no differentiable functional form (``scatter_reduce_``, ``scatter_`` with ``reduce``)
raise ``NotImplementedError`` there instead. Where such a write leaves views of the written storage to be
read after it, :func:`rebase_views_after_differentiable_writes` recomputes them from the written tensor.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import reduce
import operator
from typing import Any
import weakref

import torch

from thunder.core import devices, dtypes
import thunder.core.prims as prims
from thunder.core.compile_data import get_compile_data, get_compile_option
from thunder.core.options import INPLACE_INDEXED_WRITES_OPTIONS, resolve_inplace_indexed_writes_option
from thunder.core.proxies import IntegerProxy, ProxyTag, TensorProxy, variableify
from thunder.core.pytree import tree_flatten
from thunder.core.symbol import BoundSymbol, Symbol
from thunder.core.trace import TraceCtx, TraceProvenance, from_trace, get_tracectx, tracectx
from thunder.core.update_aliases import _is_inplace_op, _is_view_creation_op

__all__ = [
    "use_inplace_indexed_write",
    "may_require_grad",
    "mark_detached",
    "rebase_views_after_differentiable_writes",
]


def use_inplace_indexed_write(destination: TensorProxy, *values: Any) -> bool:
    """Whether an in-place indexed write of ``destination`` (with ``values`` written into it) is
    lowered to an in-place prim (:obj:`True`) or to a functional op plus ``prims.copy_`` (:obj:`False`).
    """
    option = get_compile_option(
        "inplace_indexed_writes",
        "Lower in-place indexed writes (setitem, index_copy_, index_put_, index_add_, index_fill_, scatter_, "
        "scatter_add_, scatter_reduce_, masked_fill_, masked_scatter_) to in-place prims ('inplace', the default, "
        "or 'inductor') or to a functional op and copy_ ('functional')",
    )
    if resolve_inplace_indexed_writes_option(option) is INPLACE_INDEXED_WRITES_OPTIONS.FUNCTIONAL:
        return False
    # The in-place prims have no grad rule; the functional lowering is differentiable.
    return not may_require_grad(destination, *values)


def may_require_grad(*tensors: Any) -> bool:
    """Whether grad mode is on and a gradient may flow into any of ``tensors`` (proxies of the trace
    being built). Over-approximates: a false positive only costs the functional lowering."""
    cd = get_compile_data()
    grad_enabled = cd.is_grad_enabled if cd is not None else torch.is_grad_enabled()
    return grad_enabled and _may_require_grad(*tensors)


def mark_detached(write_result: TensorProxy) -> TensorProxy:
    """Tags the output of an in-place indexed write prim as outside the autograd graph (it is only
    emitted when no gradient flows through the write), so the grad transform treats it as constant."""
    write_result.tags.add(ProxyTag.DETACHED_AUTOGRAD_GRAPH)
    return write_result


#
# Which tensors of the trace being built may require grad
#
# TensorProxy.requires_grad is reliable for the inputs of a trace only (the metas of most operations
#   create their outputs with requires_grad=False), so it is propagated here along the trace: an
#   output of an operation may require grad if one of its tensor inputs may, unless it is not of
#   a floating point dtype or it was produced where grad was disabled. The destination of an
#   in-place operation fed by such a tensor may require grad afterwards, and so may all the views of
#   its storage. This over-approximates (which only costs keeping the functional lowering).


class _GradFlow:
    def __init__(self, bsyms: list):
        self.bsyms = bsyms  # the top-level bound symbols of the trace
        self.scanned = 0  # number of top-level bound symbols already scanned
        self.names: set[str] = set()  # tensors that may require grad
        self.parent: dict[str, str] = {}  # union-find of tensors sharing storage (views)
        self.written_roots: set[str] = set()  # storages written with values that may require grad

    def find(self, name: str) -> str:
        while (p := self.parent.get(name, name)) != name:
            self.parent[name] = self.parent.get(p, p)
            name = p
        return name

    def may_require_grad(self, p: Any) -> bool:
        if not isinstance(p, TensorProxy):
            return False
        return p.requires_grad or p.name in self.names or self.find(p.name) in self.written_roots

    def scan(self, bsym) -> None:
        args = [a for a in bsym.flat_proxy_args if isinstance(a, TensorProxy)]
        outs = [o for o in bsym.flat_proxy_outs if isinstance(o, TensorProxy)]
        if args and _is_view_creation_op(bsym):
            for o in outs:
                self.parent[self.find(o.name)] = self.find(args[0].name)
        if not any(map(self.may_require_grad, args)):
            return
        for o in outs:
            if dtypes.is_inexact_dtype(o.dtype) and ProxyTag.DETACHED_AUTOGRAD_GRAPH not in o.tags:
                self.names.add(o.name)
        if args and _is_inplace_op(bsym) and not all(ProxyTag.DETACHED_AUTOGRAD_GRAPH in o.tags for o in outs):
            self.written_roots.add(self.find(args[0].name))


_grad_flows: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _query_grad_flow(query) -> bool:
    """``query(flow)`` on the grad flow of the trace being built, including the symbols still being traced
    (the write is part of their decomposition), which are scanned without memoization."""
    trace = get_tracectx()
    if trace is None:
        return False
    top = trace.bound_symbols
    flow = _grad_flows.get(trace)
    if flow is None or flow.bsyms is not top:
        flow = _grad_flows[trace] = _GradFlow(top)
    for bsym in top[flow.scanned :]:
        flow.scan(bsym)
    flow.scanned = len(top)
    if query(flow):
        return True
    inner = [bsym for scope in trace.scopes[1:] for bsym in scope]
    if not inner:
        return False
    saved = (set(flow.names), dict(flow.parent), set(flow.written_roots))
    try:
        for bsym in inner:
            flow.scan(bsym)
        return query(flow)
    finally:
        flow.names, flow.parent, flow.written_roots = saved


def _may_require_grad(*tensors: Any) -> bool:
    if any(isinstance(t, TensorProxy) and t.requires_grad for t in tensors):
        return True
    return _query_grad_flow(lambda flow: any(map(flow.may_require_grad, tensors)))


#
# Views read after a write where a gradient flows
#
# The functional lowering of ``y[0] = w`` is ``t = setitem(y, 0, w); y2 = copy_(t, y)``, and update_aliases
#   makes the later reads of ``y`` read ``y2``. A view of ``y`` taken before the write (``v = y.view(-1)``) is
#   still read as ``v`` after it, with an alias update whose gradient is the identity: the gradient of that
#   read went to ``y`` before the write, as if nothing had been overwritten, and the written values got none
#   of it. The same holds for ``y`` read after a write through one of its views (``y[1:][0] = w``).
#   rebase_views_after_differentiable_writes makes those reads read views of the written tensor instead.

# How a view op's output relates to its first argument.
_VIEW = "view"  # always a view: made again from the written tensor, it reads the written values
_MAY_VIEW = "may_view"  # a view or a copy, depending on the strides at run time (reshape, contiguous, ...)
_COPY = "copy"  # never shares storage (advanced indexing, a change of dtype or device)


@dataclass(frozen=True)
class _Alias:
    """Where a tensor of the trace sits in the storage it shares with others."""

    storage: int
    parent: None | TensorProxy = None  # the tensor it is a view of; None for a root of the storage
    view_op: Any = None  # the symbol that made it from parent, and its other arguments
    view_args: tuple = ()
    view_kwargs: Any = None
    index: None | int = None  # its position among view_op's outputs (split, unbind, ...)
    kind: str = _VIEW


def _leaf_prim_ids(bsym: BoundSymbol) -> set:
    if not bsym.subsymbols:
        return {bsym.sym.id}
    return set().union(*(_leaf_prim_ids(s) for s in bsym.subsymbols))


def _is_basic_index(key) -> None | bool:
    """True for basic indexing (a view), False for advanced indexing (a copy), None when unsure."""
    items = key if isinstance(key, tuple) else (key,)
    if any(isinstance(k, (TensorProxy, list, tuple)) for k in items):
        return False
    if all(k is None or k is Ellipsis or isinstance(k, (slice, IntegerProxy)) or (type(k) is int) for k in items):
        return True
    return None


def _view_kind(bsym: BoundSymbol) -> None | str:
    """None where ``bsym`` is no view op of its first argument, else _VIEW, _MAY_VIEW or _COPY."""
    import thunder.torch as ltorch

    if not (_is_view_creation_op(bsym) and bsym.args and isinstance(bsym.args[0], TensorProxy)):
        return None
    if bsym.sym in ltorch._syms_that_may_return_views:
        prim_ids = _leaf_prim_ids(bsym)
        if prim_ids <= {prims.PrimIDs.SHALLOW_COPY}:
            return _VIEW
        if prim_ids & {prims.PrimIDs.CONVERT_ELEMENT_TYPE, prims.PrimIDs.DEVICE_PUT, prims.PrimIDs.CLONE}:
            return _COPY
        return _MAY_VIEW
    if bsym.sym is ltorch.getitem:
        basic = _is_basic_index(bsym.args[1])
        return _VIEW if basic else _COPY if basic is False else _MAY_VIEW
    return _VIEW


def _multi_output_view_ops() -> set:
    import thunder.torch as ltorch

    return {ltorch.split, ltorch.tensor_split, ltorch.chunk, ltorch.unbind}


def _position_preserving_view_ops() -> set:
    """View ops whose output elements are distinct elements of the input, each read as it is: the positions
    of a view in its base are that view of the base's positions."""
    import thunder.torch as ltorch

    return {
        ltorch.getitem,
        ltorch.select,
        ltorch.squeeze,
        ltorch.unsqueeze,
        ltorch.view,
        ltorch.view_as,
        ltorch.unflatten,
        ltorch.permute,
        ltorch.transpose,
        ltorch.swapaxes,
        ltorch.swapdims,
        ltorch.t,
        ltorch.matrix_transpose,
        ltorch.reverse_dims_T,
        ltorch.atleast_1d,
        ltorch.atleast_2d,
        ltorch.atleast_3d,
        ltorch.movedim,
        ltorch.moveaxis,
        ltorch.narrow,
        ltorch.diagonal,
        prims.shallow_copy,
        *ltorch._syms_that_may_return_views,  # only those classified _VIEW (a shallow copy) reach here
    }


def _metadata_only_ops() -> set:
    """Ops that read only the shape, dtype and device of their tensor argument: no value, and no gradient."""
    import thunder.torch as ltorch

    names = ("empty_like", "full_like", "ones_like", "rand_like", "randint_like", "randn_like", "zeros_like")
    return {getattr(ltorch, name) for name in names if hasattr(ltorch, name)}


def _reads(bsym: BoundSymbol) -> list[TensorProxy]:
    if bsym.sym in _metadata_only_ops():
        return []
    if bsym.sym.id == prims.PrimIDs.RETURN and bsym.args and isinstance(bsym.args[0], dict):
        # thunder.jit returns the arguments ("flat_args") for its alias bookkeeping: not a read of them
        returned = {k: v for k, v in bsym.args[0].items() if k != "flat_args"}
        flat, _ = tree_flatten((returned, bsym.args[1:], bsym.kwargs))
    else:
        flat = bsym.flat_proxy_args
    return [p for p in flat if isinstance(p, TensorProxy)]


class _WriteRefused(Exception):
    """A differentiable write the rebaser cannot make right; ``error`` is what the program raises when it
    gets there."""

    def __init__(self, error: Exception):
        super().__init__(str(error))
        self.error = error


_REFUSAL_ERRORS = {cls.__name__: cls for cls in (NotImplementedError, RuntimeError)}


def _raise_when_reached_meta(error_type: str, message: str, reached: tuple, device: devices.Device, /) -> TensorProxy:
    return TensorProxy(shape=(), device=device, dtype=dtypes.float32)


def raise_when_reached_impl(error_type: str, message: str, reached: tuple, device: devices.Device, /) -> None:
    raise _REFUSAL_ERRORS[error_type](message)


# Raises ``error_type(message)`` when the computation reaches it: a computation whose differentiable write cannot
#   be made right ends in it (see _ViewRebaser._end_with_raise). Eager reaches such a write only after the
#   statements before it, and one of those may raise first (an index out of range); raised at trace time, the
#   refusal replaced that error. ``reached`` holds every tensor made before it, so that it runs after what makes
#   them whatever a fusion pass reorders. Its output (a 0-D tensor that is never made) is what the computation
#   returns, so that DCE and the forward of a grad split keep it. No gradient flows through it (it is in
#   nondifferentiable_vjp_symbols, thunder/torch/__init__.py).
raise_when_reached = Symbol(
    name="raise_when_reached",
    id="thunder.torch.indexed_writes.raise_when_reached",
    meta=_raise_when_reached_meta,
    is_prim=True,
    tags=[prims.OpTags.DONT_DCE],
    python_impl=raise_when_reached_impl,
    _print_as_impl=True,
)


def _raise_in_backward_meta(
    grad: TensorProxy, shape: tuple, dtype: dtypes.dtype, device: devices.Device, message: str, /
) -> TensorProxy:
    return TensorProxy(shape=shape, device=device, dtype=dtype)


def raise_in_backward_impl(grad: torch.Tensor, shape: tuple, dtype, device, message: str, /) -> None:
    raise RuntimeError(message)


# The gradient (of the given shape, dtype and device) of an input of an op eager has no derivative for (its
#   grad_fn is ``NotImplemented``): eager runs the forward and raises ``RuntimeError(message)`` when a backward
#   reaches the op, so this symbol stands for that gradient and raises when the backward runs it. It takes the
#   cotangent of the op's output, ``grad``, so that the grad split places it in the backward; it takes the
#   input's metadata, not the input, so that the forward saves nothing for it.
#   Limit: Thunder's backward gets a cotangent (zeros) for every output, so where a function returns the op's
#   result and another output and the backward starts from the other one only, this raises where eager does not.
raise_in_backward = Symbol(
    name="raise_in_backward",
    id="thunder.torch.indexed_writes.raise_in_backward",
    meta=_raise_in_backward_meta,
    is_prim=True,
    python_impl=raise_in_backward_impl,
    _print_as_impl=True,
)


class _ViewRebaser:
    def __init__(self, trace: TraceCtx, alias_tensor_indices: list[list[int]]):
        import thunder.torch as ltorch

        self.trace = trace
        self.new_trace = from_trace(trace)
        self.bsyms: list[BoundSymbol] = []
        self.rebased = False  # whether any read was changed
        # Tensor.copy_ is a write of its source: ``y[1:3].copy_(w)`` is ``y[1:3] = w``
        self.copy = ltorch.copy_
        self.indexed_writes = set(ltorch.inplace_indexed_writes) | {ltorch.copy_}
        self.flow = _GradFlow([])
        self.aliases: dict[str, _Alias] = {}  # the tensors that are views or have views, by name
        self.storages = 0
        # The output of an in-place op is the tensor it wrote: its name stands for that tensor here.
        self.written_by: dict[str, TensorProxy] = {}
        # Every tensor by name, and the last top-level symbol of the input trace that reads it
        self.proxies: dict[str, TensorProxy] = {}
        self.last_read: dict[str, int] = {}
        flat_args, _ = tree_flatten((trace.args, trace.kwargs))
        self._register(flat_args)
        for i, bsym in enumerate(trace.bound_symbols):
            self._register((*bsym.flat_proxy_args, *bsym.flat_proxy_outs))
            for p in _reads(bsym):
                self.last_read[p.name] = i
        # The arguments the caller may read after the call: a written one continues its history there (through
        #   torch_autograd's Function), so its last value must be the written one too. Such reads make a write
        #   through a view of an argument write into the argument, where that can be made; where it cannot, the
        #   write is made as before (the caller's later reads of the argument then miss it).
        self.read_by_caller: set[str] = {p.name for p in flat_args if isinstance(p, TensorProxy)}
        self.counting_caller_reads = True
        self.swap: dict = {}
        # The names of the input trace whose reads read a tensor now (its own name until it is replaced)
        self.stands_for: dict[str, set[str]] = {}
        # Arguments that share storage at run time: roots of one storage, with no view relation known
        for indices in alias_tensor_indices:
            group = [flat_args[i] for i in indices if i < len(flat_args) and isinstance(flat_args[i], TensorProxy)]
            if len(group) > 1:
                storage = self._new_storage()
                for p in group:
                    self.aliases[p.name] = _Alias(storage)

    def _register(self, proxies) -> None:
        for p in proxies:
            if isinstance(p, TensorProxy):
                self.proxies.setdefault(p.name, p)

    def _new_storage(self) -> int:
        self.storages += 1
        return self.storages

    def _canonical(self, p: TensorProxy) -> TensorProxy:
        return self.written_by.get(p.name, p)

    def _alias(self, p: TensorProxy) -> _Alias:
        if p.name not in self.aliases:
            self.aliases[p.name] = _Alias(self._new_storage())
        return self.aliases[p.name]

    def _names(self, name: str) -> set[str]:
        return self.stands_for.get(name, {name})

    def _read_after(self, name: str, i: int) -> bool:
        return any(
            self.last_read.get(n, -1) > i or (self.counting_caller_reads and n in self.read_by_caller)
            for n in self._names(name)
        )

    def _replace(self, old: str, new: TensorProxy) -> None:
        """Later reads of ``old`` (and of the names it stands for) read ``new``."""
        names = self._names(old)
        self.stands_for[old] = set()
        self.stands_for[new.name] = self._names(new.name) | names
        for name in names:
            self.swap[variableify(self.proxies[name])] = new

    def _ancestry(self, name: str) -> list[str]:
        """``name`` and the tensors it is a view of, up to its root."""
        names = [name]
        while (parent := self.aliases[names[-1]].parent) is not None:
            names.append(parent.name)
        return names

    def _emit(self, bsyms) -> None:
        for bsym in bsyms:
            self.flow.scan(bsym)
            self._register(bsym.flat_proxy_outs)
            self.bsyms.append(bsym)

    def _record(self, bsym: BoundSymbol) -> None:
        kind = _view_kind(bsym)
        if kind in (_VIEW, _MAY_VIEW):
            parent = self._canonical(bsym.args[0])
            storage = self._alias(parent).storage
            multiple = isinstance(bsym.output, (tuple, list))
            for index, out in enumerate(bsym.output if multiple else (bsym.output,)):
                if isinstance(out, TensorProxy) and out.name != parent.name:
                    view_op = (bsym.sym, bsym.args[1:], bsym.kwargs)
                    self.aliases[out.name] = _Alias(storage, parent, *view_op, index if multiple else None, kind)
        elif _is_inplace_op(bsym) and isinstance(bsym.output, TensorProxy) and bsym.flat_proxy_args:
            dest = bsym.flat_proxy_args[0]
            last = bsym.subsymbols[-1] if bsym.subsymbols else None
            writes_first_argument = prims.OpTags.IN_PLACE in (bsym.sym.tags or ()) or (
                last is not None and last.sym.id == prims.PrimIDs.COPY_ and last.args[1].name == dest.name
            )
            if isinstance(dest, TensorProxy) and writes_first_argument and bsym.output.name != dest.name:
                dest = self._canonical(dest)
                self.written_by[bsym.output.name] = dest
                self.stands_for[dest.name] = self._names(dest.name) | self._names(bsym.output.name)
                self.stands_for[bsym.output.name] = set()

    def _is_differentiable_write(self, bsym: BoundSymbol) -> bool:
        # An indexed write, or any other in-place op that is its functional op and a copy_ into its first
        #   argument (mul_, add_, clamp_, zero_, ...): a view read after either reads the written values.
        last = bsym.subsymbols[-1] if bsym.subsymbols else None
        return (
            (bsym.sym in self.indexed_writes or prims.OpTags.IN_PLACE in (bsym.sym.tags or ()))
            and last is not None
            and last.sym.id == prims.PrimIDs.COPY_
            and bool(last.kwargs.get("grad_enabled", False))
            and isinstance(bsym.output, TensorProxy)
            and isinstance(bsym.args[0], TensorProxy)
            and last.args[1].name == bsym.args[0].name
            and any(map(self.flow.may_require_grad, bsym.flat_proxy_args))
        )

    def run(self) -> TraceCtx:
        bsyms = self.trace.bound_symbols
        for i, bsym in enumerate(bsyms):
            bsym = bsym.from_bsym_swap_proxies(self.swap)
            if self._is_differentiable_write(bsym):
                try:
                    try:
                        self._write(i, bsym)
                    except _WriteRefused:
                        # refused (before it changed anything) maybe only for what the caller reads: without that
                        self.counting_caller_reads = False
                        self._write(i, bsym)
                    finally:
                        self.counting_caller_reads = True
                except _WriteRefused as refused:
                    if bsym.sym is self.copy and isinstance(refused.error, NotImplementedError):
                        # A copy_ it cannot make right (not eager's error: a limit here) is left as it was, stock's
                        #   lowering: that gives eager's gradient where the reads after it do not reach the copied
                        #   elements, and raising would fail a program stock runs right; where they do, the
                        #   gradient is stock's, wrong.
                        self._emit([bsym])
                        self._record(bsym)
                        continue
                    # The write's functional part first: where its own arguments are bad (an index out of
                    #   range), that raises eager's error.
                    self._emit(bsym.subsymbols[:-1])
                    self._end_with_raise(refused.error, bsyms[-1].from_bsym_swap_proxies(self.swap))
                    break
            else:
                self._emit([bsym])
                self._record(bsym)
        if not self.rebased:
            return self.trace
        self.new_trace.bound_symbols = self.bsyms
        self.new_trace.set_provenance(TraceProvenance("Rebase views read after differentiable in-place writes"))
        return self.new_trace

    def _end_with_raise(self, error: Exception, ret: BoundSymbol) -> None:
        """Ends the computation at the refused write, after its functional part: it returns what
        raise_when_reached makes, which raises. Before (``y`` and ``v`` arguments sharing storage, ``v`` read
        after a write into ``y`` where a gradient flows)::

            z = ltorch.clone(y, memory_format=_torch_memory_format_0)
            t1 = ltorch.getitem(w, None)
            t3 = ltorch.index_copy_(z, 0, i, t1)  # may raise eager's IndexError
            t5 = ltorch.setitem_(y, 1, w)
            t6 = ltorch.mul(v, 2)
            ...
            return {'output': (t12,), 'flat_args': [y, v, w, i]}

        After::

            z = ltorch.clone(y, memory_format=_torch_memory_format_0)
            t1 = ltorch.getitem(w, None)
            t3 = ltorch.index_copy_(z, 0, i, t1)
            t4 = ltorch.setitem(y, 1, w)  # the write's functional part: may raise eager's error too
            t14 = thunder.torch.indexed_writes.raise_when_reached_impl('NotImplementedError', 'setitem_: an
              in-place write into y ...', (y, v, w, i, z, t1, t3, t4), devices.Device("cpu"))
            return {"output": (t14,), "flat_args": [y, v, w, i]}
        """
        assert ret.sym.id == prims.PrimIDs.RETURN
        (returned,) = ret.args
        reached = [p for bsym in self.bsyms for p in bsym.flat_proxy_outs if isinstance(p, TensorProxy)]
        if not isinstance(returned, dict) or "output" not in returned or not reached:
            raise error  # not the computation thunder.jit traces: refuse while tracing
        with tracectx(self.new_trace):
            self.new_trace.push_scope([])
            never_made = raise_when_reached(type(error).__name__, str(error), tuple(reached), reached[0].device)
            self._emit(self.new_trace.pop_scope())
        self._emit([ret.from_bsym(args=({**returned, "output": (never_made,)},))])
        self.rebased = True

    def _check_view_chain(self, write: BoundSymbol, name: str, top: None | str, written: bool) -> None:
        """Raises where ``name`` cannot be made again from ``top`` (None: only eager's errors, up to the root)."""
        for n in self._ancestry(name):
            alias = self.aliases[n]
            if n == top or alias.parent is None:
                return
            if alias.view_op in _multi_output_view_ops():
                # eager's error, at the write (written) or where the view is used after it
                what = "is being" if written else "and its base or another view of its base has been"
                raise _WriteRefused(
                    RuntimeError(
                        f"{write.sym.name}: output {alias.index} of {alias.view_op.name} is a view {what} modified "
                        "inplace. This view is the output of a function that returns multiple views. Such functions do "
                        "not allow the output views to be modified inplace. You should replace the inplace operation by "
                        "an out-of-place one."
                    )
                )
            if alias.kind != _VIEW and top is not None:
                raise _WriteRefused(
                    NotImplementedError(
                        f"{write.sym.name}: {name} is read after an in-place write into {write.args[0].name} where a "
                        f"gradient may flow, and {alias.view_op.name} made it, which returns a view or a copy depending on "
                        "the strides: its gradient would be wrong. Make it with Tensor.view or Tensor.clone, or run under "
                        "torch.no_grad()"
                    )
                )

    def _write(self, i: int, write: BoundSymbol) -> None:
        dest, out = self._canonical(write.args[0]), write.output
        storage = self._alias(dest).storage
        self._check_view_chain(write, dest.name, None, written=True)
        live = [
            n for n, a in self.aliases.items() if a.storage == storage and n != dest.name and self._read_after(n, i)
        ]
        for n in live:
            self._check_view_chain(write, n, None, written=False)
        below = [n for n in live if dest.name in self._ancestry(n)]
        elsewhere = [n for n in live if n not in below]
        if not elsewhere:
            # The written tensor is above everything of its storage read later: make those again from it.
            for n in below:
                self._check_view_chain(write, n, dest.name, written=False)
            self._emit([write])
            self.aliases[out.name] = self.aliases[dest.name]
            self._replace(dest.name, out)
            self._make_again(dest.name, out, below)
            return
        # A tensor that the written one is a view of (or a view of that) is read later: write functionally into
        #   the lowest tensor that both are views of, copy that into it, and make what is read later again from it.
        top = self._lowest_common_ancestor(write, dest.name, elsewhere)
        for n in _below(self._ancestry(dest.name), top):
            alias = self.aliases[n]
            if alias.kind != _VIEW or alias.view_op not in _position_preserving_view_ops():
                raise _WriteRefused(
                    NotImplementedError(
                        f"{write.sym.name}: {top} is read after an in-place write into its view {dest.name}, made by "
                        f"{alias.view_op.name}, where a gradient may flow: its gradient would be wrong. Write into "
                        f"{top} instead, or run under torch.no_grad()"
                    )
                )
        for n in live:
            self._check_view_chain(write, n, top, written=False)
        written_top = self._write_through(write, dest.name, self.proxies[top])
        self.rebased = True
        self.aliases[written_top.name] = self.aliases[top]
        self._replace(top, written_top)
        again = [n for n in live if n != top]
        # The write's own output is not made: reads of it (and of its destination) read the destination made again
        self.stands_for[dest.name] = self._names(dest.name) | self._names(out.name)
        if self._read_after(dest.name, i):
            again.append(dest.name)
        self._make_again(top, written_top, again)

    def _lowest_common_ancestor(self, write: BoundSymbol, name: str, others: list[str]) -> str:
        shared = [set(self._ancestry(n)) for n in others]
        for candidate in self._ancestry(name):
            if all(candidate in s for s in shared):
                return candidate
        raise _WriteRefused(
            NotImplementedError(
                f"{write.sym.name}: an in-place write into {name} where a gradient may flow, with {others[0]} read after "
                "it: they are arguments that share storage, and its gradient would be wrong. Pass one tensor and take the "
                "other as a view of it inside the function, or run under torch.no_grad()"
            )
        )

    def _write_through(self, write: BoundSymbol, dest: str, top: TensorProxy) -> TensorProxy:
        """Emits the functional part of ``write`` and puts its result where ``dest`` lies in ``top``, in a copy
        of ``top``, which is copied into ``top``. Returns the output of that copy_."""
        import thunder.torch as ltorch

        *functional, copy = write.subsymbols
        self._emit(functional)
        updated = copy.args[0]
        with tracectx(self.new_trace):
            self.new_trace.push_scope([])
            numel = reduce(operator.mul, top.shape, 1)
            positions = ltorch.reshape(ltorch.arange(numel, device=top.device, dtype=dtypes.int64), top.shape)
            for n in reversed(_below(self._ancestry(dest), top.name)):
                # An op that may return a view is one here only as a shallow copy (`type_as`, `to` or `long` that
                #   change nothing): it keeps every position, and replayed on the positions it would convert them
                if self.aliases[n].view_op not in ltorch._syms_that_may_return_views:
                    positions = self._apply(self.aliases[n], positions)
            flat = ltorch.index_copy(
                ltorch.reshape(top, (-1,)), 0, ltorch.reshape(positions, (-1,)), ltorch.reshape(updated, (-1,))
            )
            written = ltorch.copy_(top, ltorch.reshape(flat, top.shape))
            self._emit(self.new_trace.pop_scope())
        return written

    @staticmethod
    def _apply(alias: _Alias, base: TensorProxy) -> TensorProxy:
        out = alias.view_op(base, *alias.view_args, **(alias.view_kwargs or {}))
        return out[alias.index] if alias.index is not None else out

    def _make_again(self, top: str, new_top: TensorProxy, names: list[str]) -> None:
        """Makes the views ``names`` of ``top`` again from ``new_top``; later reads of them read those."""
        made = {top: new_top}
        self.rebased = self.rebased or bool(names)
        with tracectx(self.new_trace):
            self.new_trace.push_scope([])
            for name in names:
                for n in reversed(_below(self._ancestry(name), top)):
                    if n not in made:
                        alias = self.aliases[n]
                        made[n] = self._apply(alias, made[alias.parent.name])
                        self.aliases[made[n].name] = _Alias(
                            alias.storage,
                            made[alias.parent.name],
                            alias.view_op,
                            alias.view_args,
                            alias.view_kwargs,
                            alias.index,
                        )
            self._emit(self.new_trace.pop_scope())
        for name in names:
            self._replace(name, made[name])


def _below(ancestry: list[str], top: str) -> list[str]:
    """The part of ``ancestry`` (a tensor, then the tensors it is a view of) below ``top``."""
    return ancestry[: ancestry.index(top)]


def rebase_views_after_differentiable_writes(trace: TraceCtx, alias_tensor_indices: list[list[int]]) -> TraceCtx:
    """Makes the reads of views that follow an in-place indexed write where a gradient flows read views of
    the written tensor, so that the gradient of those reads goes to the written values. Other in-place ops
    made of their functional op and a ``copy_`` into their first argument (``mul_``, ``add_``, ``clamp_``,
    ``zero_``, ...) are writes here too, and so is ``Tensor.copy_`` itself (``y[1:3].copy_(w)`` writes what
    ``y[1:3] = w`` writes).

    Two cases (``y = x * 1``, ``x`` and ``w`` requiring grad):

    - a view of the written tensor, taken before the write, read after it
      (``v = y.view(-1); y[0] = w; return (v * v).sum()``): the view is made again from the written
      tensor. Before (the trace as thunder.jit traces it, before update_aliases)::

        v = ltorch.view(y, -1)
        t3 = ltorch.setitem_(y, 0, w)
          # t2 = ltorch.setitem(y, 0, w)
          # t3 = prims.copy_(t2, y, grad_enabled=True)
        t4 = ltorch.mul(v, v)

      After::

        v = ltorch.view(y, -1)
        t3 = ltorch.setitem_(y, 0, w)
        t5 = ltorch.view(t3, -1)
        t4 = ltorch.mul(t5, t5)

    - a tensor read after a write through one of its views (``y[1:][0] = w; return (y * y).sum()``):
      the functional result is written into the positions the view has in that tensor, functionally,
      and copied into it; the views read later are made again from the copy. Before::

        t1 = ltorch.getitem(y, slice(1, None, None))
        t3 = ltorch.setitem_(t1, 0, w)
          # t2 = ltorch.setitem(t1, 0, w)
          # t3 = prims.copy_(t2, t1, grad_enabled=True)
        t4 = ltorch.mul(y, y)

      After (full-size copies of ``y``: only here, where the gradient needs them)::

        t1 = ltorch.getitem(y, slice(1, None, None))
        t2 = ltorch.setitem(t1, 0, w)
        t5 = ltorch.arange(12, device=..., dtype=dtypes.int64)
        t6 = ltorch.reshape(t5, (4, 3))
        t7 = ltorch.getitem(t6, slice(1, None, None))                  # the positions of t1 in y
        t8 = ltorch.reshape(y, (-1,))
        t9 = ltorch.reshape(t7, (-1,))
        t10 = ltorch.reshape(t2, (-1,))
        t11 = ltorch.index_copy(t8, 0, t9, t10)
        t12 = ltorch.reshape(t11, (4, 3))
        t13 = ltorch.copy_(y, t12)
        t4 = ltorch.mul(t13, t13)

    Where the views cannot be made again and the gradient would be wrong, the computation raises
    ``NotImplementedError`` when it reaches the write (an error of a statement before it comes first, as in
    eager): a view read after the write was made by an op that returns a view or a copy depending on strides
    (``reshape``, ``contiguous``), the written view is not a plain selection of the tensor read after
    (``expand``, ``unfold``, ``real``), or they are arguments that share storage. A write that changes views
    made by ``split``, ``chunk``, ``unbind`` or ``tensor_split`` which are used after it raises eager's
    ``RuntimeError`` the same way. Writes where no gradient flows (the in-place prims) are left as they are,
    and so is a ``copy_`` that would raise ``NotImplementedError`` (stock's lowering, see ``run``).
    """
    import thunder.torch as ltorch

    writes = set(ltorch.inplace_indexed_writes) | {ltorch.copy_}
    if not any(
        (bsym.sym in writes or prims.OpTags.IN_PLACE in (bsym.sym.tags or ()))
        and bsym.subsymbols
        and bsym.subsymbols[-1].sym.id == prims.PrimIDs.COPY_
        for bsym in trace.bound_symbols
    ):
        return trace
    return _ViewRebaser(trace, alias_tensor_indices).run()
