"""Attention over grouped key/value heads without materializing the repeated heads.

Grouped-query attention models keep ``kv`` key/value heads for ``H = kv * n_rep`` query heads. Their
attention code usually repeats each key/value head ``n_rep`` times before calling
``scaled_dot_product_attention``: Hugging Face's ``repeat_kv`` (an expand then a reshape), or
``repeat_interleave(n_rep, dim=1)`` in litgpt and gpt-fast. The reshape of the expanded tensor is a copy:
in a decode step it copies every layer's whole key and value cache, ``n_rep`` times over, to attend with a
single query token. Eager Hugging Face code avoids it when it is not being compiled (``pack_gqa``: the
query heads of a group become query rows of that group); under a compiler it takes the repeat path.

:func:`attend_to_grouped_kv_heads` rewrites such an attention on the computation trace so that it reads
the grouped heads directly (``scaled_dot_product_attention``, and the two ``matmul``s of an attention
written out, as gpt-oss does around its attention sinks): the ``n_rep`` query heads of a group are folded into the query-length axis,
attention runs on the ``kv`` heads, and the result is unfolded. Only the query, the result and (where it
varies by query head or row) the mask are reshaped; they are the size of a step's activations, not of
the cache. The repeat becomes dead code, which DCE removes.

Before (decode step of a layer with 4 query heads and 2 key/value heads; ``k``/``v`` are the cache)::

    t0 = ltorch.getitem(k, (slice(None), slice(None), None))   # [1, 2, 1, 32768, 64], a view
    t1 = ltorch.expand(t0, 1, 2, 2, 32768, 64)                  # a view
    t2 = ltorch.reshape(t1, 1, 4, 32768, 64)                    # a copy of 2x the cache
    ... the same for v: t5 ...
    out = ltorch.scaled_dot_product_attention(q, t2, t5, mask, 0.0, False, scale=0.125)  # q: [1, 4, 1, 64]

After::

    t6 = ltorch.reshape(q, 1, 2, 2, 64)                         # query heads of a group as query rows
    t7 = ltorch.scaled_dot_product_attention(t6, k, v, mask, 0.0, False, scale=0.125)  # [1, 2, 2, 64]
    out = ltorch.reshape(t7, 1, 4, 1, 64)

This is the same computation (each query head attends to the keys of its group with its own softmax row)
with the same operands, so the tokens a model produces do not change; the matmul shapes do, so the last
bits of the result may differ from the repeated form, as they do between eager's two forms.

A ``matmul(a, r)`` or ``matmul(a, r.transpose(2, 3))`` whose ``r`` is a head repeat of a 4-D ``x`` becomes
``matmul(a folded, x)`` (or ``x.transpose(2, 3)``), unfolded: the scores and the weighted sum of the
written-out attention.

The attention rewrite applies when both key and value are repeats of the same grouping of 4-D tensors, the query
is 4-D with the key's batch, ``dropout_p`` is 0 and ``is_causal`` is False (folding query heads into rows
would shift a causal mask, which is aligned to the top-left of each head's rows). Anything else is left
as it is.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

from thunder.core import prims
from thunder.core.proxies import TensorProxy, variableify
from thunder.core.trace import TraceCtx, TraceProvenance, from_trace, tracectx
from thunder.core.symbol import BoundSymbol
import thunder.torch as ltorch

__all__ = ["attend_to_grouped_kv_heads"]


@dataclass(frozen=True)
class _RepeatedHeads:
    """``grouped`` [B, kv, L, D] with each head repeated ``n_rep`` times along dim 1, by the ops
    ``repeat_ops``."""

    grouped: TensorProxy
    n_rep: int
    repeat_ops: tuple[BoundSymbol, ...] = ()


def _prims_of(bsym: BoundSymbol) -> list[BoundSymbol]:
    """The primitives ``bsym`` runs that make tensors, in order (not queries such as ``prims.shape``)."""
    if bsym.sym.is_prim or not bsym.subsymbols:
        return [bsym] if isinstance(bsym.output, TensorProxy) else []
    return [p for sub in bsym.subsymbols for p in _prims_of(sub)]


def _shape(t: TensorProxy) -> tuple[int, ...]:
    return tuple(int(s) for s in t.shape)


def _same(a, b) -> bool:
    # Passes that rebuild bound symbols make new proxy objects with the same names.
    return isinstance(a, TensorProxy) and isinstance(b, TensorProxy) and a.name == b.name


def _as_repeat(source: TensorProxy, steps: list[BoundSymbol], repeated: TensorProxy) -> _RepeatedHeads | None:
    """Whether the primitives ``steps`` (broadcasts, then at most one reshape) make ``repeated`` from
    ``source`` by repeating its heads (dim 1) in place: ``repeat_kv``, ``repeat_interleave(n, dim=1)``, or
    a broadcast of a single key/value head to all query heads."""
    if source.ndim != 4 or repeated.ndim != 4:
        return None
    current, shape, dims = source, _shape(source), tuple(range(4))  # source dim i -> dim dims[i] of shape
    reshaped_to = None
    for step in steps:
        if not step.args or not _same(step.args[0], current) or reshaped_to is not None:
            return None
        if step.sym.id == prims.PrimIDs.BROADCAST_IN_DIM:
            _, new_shape, broadcast_dims = step.args[:3]
            dims = tuple(int(broadcast_dims[d]) for d in dims)
            shape = tuple(int(s) for s in new_shape)
        elif step.sym.id == prims.PrimIDs.RESHAPE:
            reshaped_to = tuple(int(s) for s in step.args[1])
        else:
            return None
        current = step.output
    if not _same(current, repeated):
        return None
    batch, kv, length, head_dim = _shape(source)
    if reshaped_to is None:  # a broadcast of one key/value head to every query head
        if kv == 1 and dims == (0, 1, 2, 3) and shape == (batch, shape[1], length, head_dim) and shape[1] > 1:
            return _RepeatedHeads(source, shape[1])
        return None
    if len(shape) != 5 or dims != (0, 1, 3, 4):
        return None
    n_rep = shape[2]
    if shape != (batch, kv, n_rep, length, head_dim) or reshaped_to != (batch, kv * n_rep, length, head_dim):
        return None
    return _RepeatedHeads(source, n_rep) if n_rep > 1 else None


def _find_repeat(repeated: TensorProxy, producers: dict[str, BoundSymbol]) -> _RepeatedHeads | None:
    """Walks back from ``repeated`` through the ops that produced it (each running only broadcasts and
    reshapes) until the chain from some earlier tensor is a head repeat."""
    steps: list[BoundSymbol] = []
    repeat_ops: list[BoundSymbol] = []
    current = repeated
    for _ in range(4):  # repeat_kv is three ops; repeat_interleave one
        producer = producers.get(current.name)
        if producer is None:
            return None
        repeat_ops.append(producer)
        prims_run = _prims_of(producer)
        if not prims_run or any(
            p.sym.id not in (prims.PrimIDs.BROADCAST_IN_DIM, prims.PrimIDs.RESHAPE) for p in prims_run
        ):
            return None
        steps = prims_run + steps
        current = prims_run[0].args[0]
        if not isinstance(current, TensorProxy):
            return None
        if (found := _as_repeat(current, steps, repeated)) is not None:
            return _RepeatedHeads(found.grouped, found.n_rep, tuple(repeat_ops))
    return None


_SDPA_SIGNATURE = inspect.signature(ltorch.scaled_dot_product_attention.meta)


def _grouped_attention(query, key, value, attn_mask, scale, n_rep: int):
    """``scaled_dot_product_attention`` of ``query`` [B, kv * n_rep, Lq, D] over ``key``/``value``
    [B, kv, L, D], each key/value head serving ``n_rep`` consecutive query heads."""
    batch, heads, q_len, head_dim = _shape(query)
    kv = heads // n_rep
    folded_query = ltorch.reshape(query, (batch, kv, n_rep * q_len, head_dim))
    if attn_mask is not None:
        mask_shape = (1,) * (4 - attn_mask.ndim) + _shape(attn_mask)
        mask_batch, mask_heads, mask_rows, key_len = mask_shape
        if mask_heads != 1 or mask_rows != 1:  # differs by head or by query row: fold it like the query
            mask_groups, mask_reps = (kv, n_rep) if mask_heads == heads else (1, 1)
            mask = ltorch.reshape(attn_mask, (mask_batch, mask_groups, mask_reps, mask_rows, key_len))
            mask = ltorch.expand(mask, (mask_batch, mask_groups, n_rep, q_len, key_len))
            attn_mask = ltorch.reshape(mask, (mask_batch, mask_groups, n_rep * q_len, key_len))
    out = ltorch.scaled_dot_product_attention(folded_query, key, value, attn_mask, 0.0, False, scale=scale)
    return ltorch.reshape(out, (batch, heads, q_len, int(value.shape[-1])))


def _rewritable(call: inspect.BoundArguments, key: _RepeatedHeads, value: _RepeatedHeads) -> bool:
    query, attn_mask = call.arguments["query"], call.arguments["attn_mask"]
    if call.arguments["dropout_p"] != 0 or call.arguments["is_causal"] is not False:
        return False
    if key.n_rep != value.n_rep or _shape(key.grouped)[:2] != _shape(value.grouped)[:2]:
        return False
    if not isinstance(query, TensorProxy) or query.ndim != 4:
        return False
    batch, heads, q_len, _ = _shape(query)
    batch_kv, kv = _shape(key.grouped)[:2]
    if batch != batch_kv or heads != kv * key.n_rep:
        return False
    if attn_mask is None:
        return True
    if not isinstance(attn_mask, TensorProxy) or attn_mask.ndim > 4:
        return False
    mask_batch, mask_heads, mask_rows, _ = (1,) * (4 - attn_mask.ndim) + _shape(attn_mask)
    return mask_batch in (1, batch) and mask_heads in (1, heads) and mask_rows in (1, q_len)


def _grouped_matmul(a, grouped, transposed: bool, n_rep: int):
    """``a @ repeat(grouped)`` (``a @ repeat(grouped).transpose(2, 3)`` if ``transposed``) without the
    repeat: ``a`` [B, kv * n_rep, M, K] is folded to [B, kv, n_rep * M, K] like the query above."""
    batch, heads, rows, inner = _shape(a)
    kv = heads // n_rep
    folded = ltorch.reshape(a, (batch, kv, n_rep * rows, inner))
    right = ltorch.transpose(grouped, 2, 3) if transposed else grouped
    out = ltorch.matmul(folded, right)
    return ltorch.reshape(out, (batch, heads, rows, int(out.shape[-1])))


def _sdpa_rewrite(bsym: BoundSymbol, producers: dict[str, BoundSymbol]):
    """``(replacement maker, repeat ops)`` for an attention over repeated heads, or ``None``."""
    try:
        call = _SDPA_SIGNATURE.bind(*bsym.args, **bsym.kwargs)
    except TypeError:
        return None
    call.apply_defaults()
    key, value = call.arguments["key"], call.arguments["value"]
    if not (isinstance(key, TensorProxy) and isinstance(value, TensorProxy)):
        return None
    key_repeat, value_repeat = _find_repeat(key, producers), _find_repeat(value, producers)
    if not (key_repeat and value_repeat and _rewritable(call, key_repeat, value_repeat)):
        return None
    args = call.arguments

    def replacement():
        return _grouped_attention(
            args["query"], key_repeat.grouped, value_repeat.grouped, args["attn_mask"], args["scale"], key_repeat.n_rep
        )

    return replacement, key_repeat.repeat_ops + value_repeat.repeat_ops


def _matmul_rewrite(bsym: BoundSymbol, producers: dict[str, BoundSymbol]):
    """The same for ``a @ repeat(x)`` and ``a @ repeat(x).transpose(2, 3)``: the two matmuls of an
    attention written out (gpt-oss, with its attention sinks, and Hugging Face's eager attention)."""
    if len(bsym.args) != 2 or bsym.kwargs or not all(isinstance(t, TensorProxy) for t in bsym.args):
        return None
    a, b = bsym.args
    if a.ndim != 4 or b.ndim != 4:
        return None
    transposed, transpose_ops, repeated = False, (), b
    producer = producers.get(b.name)
    steps = _prims_of(producer) if producer is not None else []
    if len(steps) == 1 and steps[0].sym.id == prims.PrimIDs.TRANSPOSE and tuple(steps[0].args[1]) == (0, 1, 3, 2):
        transposed, transpose_ops, repeated = True, (producer,), steps[0].args[0]
    found = _find_repeat(repeated, producers)
    if found is None:
        return None
    batch, heads = _shape(a)[:2]
    batch_kv, kv = _shape(found.grouped)[:2]
    if batch != batch_kv or heads != kv * found.n_rep:
        return None

    def replacement():
        return _grouped_matmul(a, found.grouped, transposed, found.n_rep)

    return replacement, transpose_ops + found.repeat_ops


def attend_to_grouped_kv_heads(trace: TraceCtx) -> TraceCtx:
    """Rewrites every ``scaled_dot_product_attention`` in ``trace`` whose key and value are head repeats
    of grouped key/value tensors, and every ``matmul`` whose right operand is one (or its transpose), to
    read the grouped tensors (see the module docstring). Returns ``trace`` itself when there is none."""
    producers: dict[str, BoundSymbol] = {}
    rewrites: dict[int, tuple] = {}  # index of the bound symbol -> (replacement maker, repeat ops)
    for index, bsym in enumerate(trace.bound_symbols):
        if bsym.sym.id == ltorch.scaled_dot_product_attention.id:
            rewrite = _sdpa_rewrite(bsym, producers)
        elif bsym.sym.id == ltorch.matmul.id:
            rewrite = _matmul_rewrite(bsym, producers)
        else:
            rewrite = None
        if rewrite is not None:
            rewrites[index] = rewrite
        for out in bsym.flat_proxy_outs:
            producers[out.name] = bsym
    if not rewrites:
        return trace

    # The repeats lose their reader. They are removed here rather than left to DCE: the alias pass that
    # runs before DCE would otherwise list the repeated copies among the cache's aliases and keep them.
    repeat_ops = {id(op) for _, ops in rewrites.values() for op in ops}
    new_trace = from_trace(trace)
    for index, bsym in enumerate(trace.bound_symbols):
        if index not in rewrites:
            new_trace.bound_symbols.append(bsym)
            continue
        make_replacement, _ = rewrites[index]
        with tracectx(new_trace):
            new_trace.push_scope([])
            out = make_replacement()
            replacement = new_trace.pop_scope()
        # The last op of the replacement produces the original output proxy.
        swap = {variableify(out): bsym.output}
        new_trace.bound_symbols.extend(b.from_bsym_swap_proxies(swap) for b in replacement)
    new_trace.bound_symbols = _without_unused(new_trace.bound_symbols, repeat_ops)
    new_trace.set_provenance(TraceProvenance("Attention over grouped key/value heads (no repeated copies)"))
    return new_trace


def _without_unused(bsyms: list[BoundSymbol], removable: set[int]) -> list[BoundSymbol]:
    """``bsyms`` less those in ``removable`` (by id) whose results nothing reads."""
    read: set[str] = set()
    kept: list[BoundSymbol] = []
    for bsym in reversed(bsyms):
        if id(bsym) in removable and not any(out.name in read for out in bsym.flat_proxy_outs):
            continue
        kept.append(bsym)
        read.update(arg.name for arg in bsym.flat_proxy_args)
    return kept[::-1]
