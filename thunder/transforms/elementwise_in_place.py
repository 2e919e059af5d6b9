"""Run an elementwise op whose result is copied into its first argument as torch's in-place op.

Thunder traces ``logits.sub_(state)`` as the functional op and a copy back (``ltorch.sub_`` is ``sub`` +
``prims.copy_``), and the torch executor runs exactly that: a temporary of the destination's size and a
second pass over it. On a graph input (sampling penalties on ``[batch, vocab]`` logits, a KV cache's
scale) that is a full-size allocation per call that eager does not make. Fusion executors do not need
this (nvFuser and Inductor write the copy's destination from inside the fused kernel); the torch executor
runs one op at a time, so the pair is rewritten into the op torch itself offers.

Before (execution trace, torch executor)::

    (t6,) = update_aliases((logits,))
    t7 = torch.sub(t6, state, alpha=1)    # a temporary the size of logits
    t8 = copy_(t7, t6, grad_enabled=True)
    return ()

After::

    (t6,) = update_aliases((logits,))
    t8 = sub_in_place(t6, state, alpha=1)  # Tensor.sub_: writes logits, returns it
    return ()

The rewrite keeps eager's values bit for bit (same kernel, same dtype) and applies only where nothing can
tell the difference:

* the op is one the torch executor runs, has an in-place form in ``torch.Tensor``, is elementwise over its
  first argument (it is the out-of-place form of one of ``thunder.torch``'s in-place ops) and is not
  random, collective or an indexed write (those have their own lowering);
* its result has the destination's shape, dtype and device and is used by the copy alone;
* its other tensor arguments do not share the destination's storage (``x.mul_(x.flip(0))`` keeps the
  functional form: the in-place kernel would read elements it already wrote);
* nothing between the op and the copy touches that storage or writes any other (the in-place op runs where
  the op was, and writes keep their program order: one that raises stops the writes after it), and nothing
  after the copy reads a name of it from before the copy (the old value is dead: no read of it, no view of
  it read later, nothing saved for a backward).

It runs only on a computation trace without a backward (the grad transform saves inputs of ops for the
backward, and the in-place form would overwrite them).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

from thunder.core import prims
from thunder.core.aliasing import AliasSets, writes_in_place
from thunder.core.proxies import TensorProxy
from thunder.core.symbol import BoundSymbol
from thunder.core.trace import TraceCtx, from_trace, TraceProvenance

__all__ = ["run_elementwise_copies_in_place"]

_COPY_IDS = (prims.PrimIDs.COPY_, "copy_")
# Out-of-place forms of in-place ops that are not elementwise over their destination, or that must keep their
# own semantics (randomness, collectives, the indexed writes that thunder.torch.indexed_writes lowers).
_EXCLUDED = frozenset(
    {
        "all_gather",
        "all_reduce",
        "reduce_scatter",
        "exponential",
        "rrelu",
        "cumsum",
        "setitem",
        "index_add",
        "index_copy",
        "index_fill",
        "index_put",
        "masked_scatter",
        "scatter",
        "scatter_add",
        "scatter_reduce",
    }
)
_in_place_symbols: dict[str, Callable] = {}


def _elementwise_out_of_place_names() -> frozenset[str]:
    import thunder.torch as ltorch

    names = {fn.name for fn, index in ltorch._inplace_to_out_of_place.values() if index == -1 and hasattr(fn, "name")}
    return frozenset(names - _EXCLUDED)


def _in_place_symbol(name: str):
    """The torch executor's operator for ``torch.Tensor.<name>_`` (made on first use)."""
    import torch
    from thunder.executors.torchex import ex as pytorch_ex

    if name not in _in_place_symbols:
        method = getattr(torch.Tensor, f"{name}_")

        def meta(a, /, *args, **kwargs):
            return TensorProxy(like=a)

        # Tagged in place, so that thunder.core.aliasing (and every pass that orders writes) sees the write.
        _in_place_symbols[name] = pytorch_ex.register_operator(
            f"{name}_in_place", meta=meta, fn=method, tags=[prims.OpTags.IN_PLACE]
        )
    return _in_place_symbols[name]


def _tensors(bsym: BoundSymbol) -> list[TensorProxy]:
    return [p for p in bsym.flat_proxy_args if isinstance(p, TensorProxy)]


def _in_place_candidate(producer: BoundSymbol, names: frozenset[str]) -> str | None:
    """The op's name if ``producer`` is an elementwise torch-executor op with a ``Tensor`` in-place form."""
    import torch
    from thunder.executors.torchex import ex as pytorch_ex

    if producer.sym.executor is not pytorch_ex or len(producer.subsymbols) != 1:
        return None
    op = producer.subsymbols[0].sym
    name = op.name
    if name not in names or producer.sym.name != name:
        return None
    # F.relu(a, inplace) and the like: the Tensor method takes no such argument.
    if "inplace" in producer.kwargs or "inplace" in inspect.signature(op.meta).parameters:
        return None
    if not hasattr(torch.Tensor, f"{name}_"):
        return None
    return name


def run_elementwise_copies_in_place(trace: TraceCtx) -> TraceCtx:
    """See the module docstring. Returns ``trace`` itself when nothing is rewritten."""
    bsyms = list(trace.bound_symbols)
    if not any(b.sym.id in _COPY_IDS for b in bsyms):
        return trace
    names = _elementwise_out_of_place_names()
    alias_sets = AliasSets(bsyms)
    producer_of: dict[str, int] = {}
    uses: dict[str, list[int]] = {}
    defined_at: dict[str, int] = {p.name: -1 for p in _tensors_of_signature(trace)}
    for k, bsym in enumerate(bsyms):
        if bsym.sym.id is not prims.PrimIDs.DEL:
            for p in bsym.flat_proxy_args:
                if isinstance(p, TensorProxy):
                    uses.setdefault(p.name, []).append(k)
        for p in bsym.flat_proxy_outs:
            if isinstance(p, TensorProxy):
                producer_of[p.name] = k
                defined_at.setdefault(p.name, k)

    rewrites: dict[int, tuple[int, BoundSymbol]] = {}  # copy index -> (producer index, new bsym)
    for j, copy in enumerate(bsyms):
        if copy.sym.id not in _COPY_IDS:
            continue
        args = _tensors(copy)
        if len(args) != 2 or not isinstance(copy.output, TensorProxy):
            continue
        src, dst = args
        i = producer_of.get(src.name)
        if i is None or i >= j or i in rewrites or any(pi == i for pi, _ in rewrites.values()):
            continue
        producer = bsyms[i]
        name = _in_place_candidate(producer, names)
        if name is None or not isinstance(producer.output, TensorProxy) or producer.output.name != src.name:
            continue
        op_args = _tensors(producer)
        if not op_args or op_args[0].name != dst.name or not isinstance(producer.args[0], TensorProxy):
            continue
        if (src.shape, src.dtype, src.device) != (dst.shape, dst.dtype, dst.device):
            continue
        if uses.get(src.name, []) != [j]:
            continue
        storage = alias_sets.find(dst.name)
        if any(alias_sets.find(p.name) == storage for p in op_args[1:]):
            continue
        if any(alias_sets.find(p.name) == storage for k in range(i + 1, j) for p in _tensors(bsyms[k])):
            continue
        if any(writes_in_place(bsyms[k]) for k in range(i + 1, j)):
            continue
        if _old_value_read_after(j, storage, copy.output.name, alias_sets, uses, defined_at):
            continue
        in_place = _in_place_symbol(name).bind(*producer.args, output=copy.output, **producer.kwargs)
        in_place.header = producer.header
        rewrites[j] = (i, in_place)

    if not rewrites:
        return trace
    replaced = {i: new for i, new in rewrites.values()}
    new_trace = from_trace(trace)
    new_trace.bound_symbols = [replaced.get(k, bsym) for k, bsym in enumerate(bsyms) if k not in rewrites]
    new_trace.set_provenance(TraceProvenance("Elementwise ops copied into their first argument run in place"))
    return new_trace


def _tensors_of_signature(trace: TraceCtx) -> list[TensorProxy]:
    from thunder.core.pytree import tree_flatten

    flat, _ = tree_flatten((trace.args, trace.kwargs))
    return [p for p in flat if isinstance(p, TensorProxy)]


def _old_value_read_after(
    j: int, storage: str, new_name: str, alias_sets: AliasSets, uses: dict[str, list[int]], defined_at: dict[str, int]
) -> bool:
    """Whether a bound symbol after ``j`` reads a proxy of ``storage`` defined at or before ``j`` (other than
    the copy's own output, the new value)."""
    for name, at in defined_at.items():
        if at > j or name == new_name or alias_sets.find(name) != storage:
            continue
        if any(k > j for k in uses.get(name, ())):
            return True
    return False
