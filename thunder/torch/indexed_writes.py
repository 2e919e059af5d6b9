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
raise ``NotImplementedError`` there instead.
"""

from __future__ import annotations

from typing import Any
import weakref

import torch

from thunder.core import dtypes
from thunder.core.compile_data import get_compile_data, get_compile_option
from thunder.core.options import INPLACE_INDEXED_WRITES_OPTIONS, resolve_inplace_indexed_writes_option
from thunder.core.proxies import ProxyTag, TensorProxy
from thunder.core.trace import get_tracectx
from thunder.core.update_aliases import _is_inplace_op, _is_view_creation_op

__all__ = [
    "use_inplace_indexed_write",
    "may_require_grad",
    "shares_storage_in_trace",
    "mark_detached",
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


def shares_storage_in_trace(t: TensorProxy) -> bool:
    """Whether ``t`` is a view made in the trace being built, or has such views."""

    def query(flow: _GradFlow) -> bool:
        root = flow.find(t.name)
        return root != t.name or any(flow.find(name) == root for name in flow.parent if name != t.name)

    return isinstance(t, TensorProxy) and _query_grad_flow(query)
