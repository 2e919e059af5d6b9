"""Attention over grouped key/value heads without materializing the repeated heads.

Grouped-query attention models keep ``kv`` key/value heads for ``H = kv * n_rep`` query heads. Their
attention code usually repeats each key/value head ``n_rep`` times before calling
``scaled_dot_product_attention``: Hugging Face's ``repeat_kv`` (an expand then a reshape), or
``repeat_interleave(n_rep, dim=1)`` in litgpt and gpt-fast. The reshape of the expanded tensor is a copy:
in a decode step it copies every layer's whole key and value cache, ``n_rep`` times over, to attend with a
single query token; in a prefill it copies the prompt's keys and values ``n_rep`` times over. Eager Hugging
Face code avoids it when it is not being compiled (``pack_gqa``); under a compiler it takes the repeat path.

:class:`GroupedQueryAttentionTransform` rewrites such an attention on the computation trace so that it
reads the grouped heads. ``thunder.jit`` runs it before the alias pass (which would otherwise list the
repeated copies among the cache's aliases) as its compile option ``grouped_query_attention`` chooses:

``"sdpa"`` (the default)
    ``scaled_dot_product_attention(q, repeat(k), repeat(v), mask, ...)`` on CPU (PyTorch 2.9 and later) becomes
    ``scaled_dot_product_attention(q, k, v, mask, ..., enable_gqa=True)``. PyTorch's CPU kernel reads key/value
    head ``h // n_rep`` for query head ``h`` with the same blocking, so the result is bitwise the attention
    over the repeated heads (eager's); the query, the mask and ``is_causal`` are passed as they are, and no
    size is read from the trace. CUDA is left alone: the fused kernels the executors pick there decline
    ``enable_gqa`` (PyTorch's memory-efficient kernel has no grouped-query support), and the math
    fallback would make the whole score matrix.
``"fold"``
    The ``n_rep`` query heads of a group are folded into the query-length axis, attention runs on the
    ``kv`` heads, and the result is unfolded: ``scaled_dot_product_attention`` (on any device, where the
    mask folds; elsewhere on CPU as ``"sdpa"``) and the two ``matmul``s of an attention written out
    (gpt-oss around its attention sinks, Hugging Face's eager attention). For a decode step this is the
    very call eager Hugging Face code makes when it is not compiled (``pack_gqa``), so a model decodes with
    its eager bits, and the CPU kernel reads each key/value head once instead of once per query head of
    the group (``enable_gqa``). The shapes change, and with them the last bits against the attention over
    the repeated heads that the traced program asks for, so it is opt-in.
``"off"``
    Nothing is rewritten.

Before (decode step of a layer with 4 query heads and 2 key/value heads; ``k``/``v`` are the cache)::

    t0 = ltorch.getitem(k, (slice(None), slice(None), None))   # [1, 2, 1, 32768, 64], a view
    t1 = ltorch.expand(t0, 1, 2, 2, 32768, 64)                  # a view
    t2 = ltorch.reshape(t1, 1, 4, 32768, 64)                    # a copy of 2x the cache
    ... the same for v: t5 ...
    out = ltorch.scaled_dot_product_attention(q, t2, t5, mask, 0.0, False, scale=0.125)  # q: [1, 4, 1, 64]

After, with ``"sdpa"``::

    out = ltorch.scaled_dot_product_attention(q, k, v, mask, 0.0, False, scale=0.125, enable_gqa=True)

Where no executor runs the whole op (under autograd Thunder differentiates the decomposition), the
decomposition repeats the heads as the program did.

After, with ``"fold"`` (the sizes come from the proxies, so a trace made under ``cache="symbolic values"``
stays right for other sizes)::

    (b, h, m, d) = prims.shape(q)
    (_, g, _, _) = prims.shape(k)
    t6 = ltorch.reshape(q, (b, g, -1, d))                       # query heads of a group as query rows
    t7 = ltorch.scaled_dot_product_attention(t6, k, v, mask, 0.0, False, scale=0.125)  # [1, 2, 2, 64]
    out = ltorch.reshape(t7, (b, h, m, d))

Folding never copies the mask: a mask is kept only where it is the same for every query head and row of
a group (no head and row dims, or dims of size 1 fixed in the trace, such as a key-padding mask); a mask
that varies by query row (a prefill's causal mask) or head would have to be repeated ``n_rep`` times, so
such an attention is left as it is, as are ``is_causal`` (a causal mask is aligned to each head's rows)
and dropout. The query is copied where its layout does not fold (the size of one step's queries, not of
the keys).

The repeat is recognized from the primitives that make the key and value (broadcasts, then at most one
reshape of a 4-D tensor): the sizes it keeps must be the very sizes of the grouped tensor (the same
proxies, or equal ints), so the match holds for every size the trace may be called with.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from enum import Enum, auto
from numbers import Number
from typing import Any

import torch
from looseversion import LooseVersion

from thunder.core import devices, prims
from thunder.core.options import _unknown_option
from thunder.core.proxies import IntegerProxy, TensorProxy, variableify
from thunder.core.symbol import BoundSymbol
from thunder.core.trace import TraceCtx, TraceProvenance, from_trace, tracectx
from thunder.core.transform_common import Transform
import thunder.torch as ltorch

__all__ = [
    "GROUPED_QUERY_ATTENTION_OPTIONS",
    "GroupedQueryAttentionTransform",
    "resolve_grouped_query_attention_option",
]


class GROUPED_QUERY_ATTENTION_OPTIONS(Enum):
    """What ``thunder.jit``'s compile option ``grouped_query_attention`` rewrites; see the module docstring."""

    OFF = auto()
    SDPA = auto()
    FOLD = auto()


_str_to_grouped_query_attention_options_map: dict[str, GROUPED_QUERY_ATTENTION_OPTIONS] = {
    "off": GROUPED_QUERY_ATTENTION_OPTIONS.OFF,
    "sdpa": GROUPED_QUERY_ATTENTION_OPTIONS.SDPA,
    "fold": GROUPED_QUERY_ATTENTION_OPTIONS.FOLD,
}
_DEFAULT_OPTION = "sdpa"

# scaled_dot_product_attention has enable_gqa from PyTorch 2.5, but its CPU kernel gives the bits of the
#   repeated heads only from 2.9 (2.7.1 and 2.8.0 differ in the last bits, and 2.7.1 grew the peak memory by
#   more than the repeats): before 2.9, attention on CPU is left as it is.
CPU_ENABLE_GQA_IS_BITWISE = LooseVersion(torch.__version__.split("+")[0]) >= LooseVersion("2.9")


def resolve_grouped_query_attention_option(x: Any, /) -> GROUPED_QUERY_ATTENTION_OPTIONS:
    """``None`` is the default; ``False`` is ``"off"``."""
    if x is None:
        x = _DEFAULT_OPTION
    elif x is False:
        x = "off"
    if isinstance(x, GROUPED_QUERY_ATTENTION_OPTIONS):
        return x
    option = _str_to_grouped_query_attention_options_map.get(x.lower()) if isinstance(x, str) else None
    if option is None:
        _unknown_option(
            "grouped_query_attention", _str_to_grouped_query_attention_options_map.keys(), _DEFAULT_OPTION, x
        )
    return option


@dataclass(frozen=True)
class _RepeatedHeads:
    """``grouped`` [B, kv, L, D] with each head repeated along dim 1 by the ops ``repeat_ops``."""

    grouped: TensorProxy
    repeat_ops: tuple[BoundSymbol, ...] = ()


def _prims_of(bsym: BoundSymbol) -> list[BoundSymbol]:
    """The primitives ``bsym`` runs that make tensors, in order (not queries such as ``prims.shape``)."""
    if bsym.sym.is_prim or not bsym.subsymbols:
        return [bsym] if isinstance(bsym.output, TensorProxy) else []
    return [p for sub in bsym.subsymbols for p in _prims_of(sub)]


def _same(a, b) -> bool:
    # Passes that rebuild bound symbols make new proxy objects with the same names.
    return isinstance(a, TensorProxy) and isinstance(b, TensorProxy) and a.name == b.name


def _same_size(a, b) -> bool:
    """Whether two sizes are the same for every call of the trace: equal ints, or the same proxy. Equal
    values of different proxies are not (under ``cache="symbolic values"`` they may differ next call)."""
    if isinstance(a, IntegerProxy) or isinstance(b, IntegerProxy):
        return isinstance(a, IntegerProxy) and isinstance(b, IntegerProxy) and a.name == b.name
    return a == b


def _fixed(size) -> int | None:
    """``size`` if it is an int fixed in the trace (checked by the prologue), else ``None``."""
    if isinstance(size, IntegerProxy):
        return int(size) if size.is_static() else None
    return size if isinstance(size, Number) else None


def _as_repeat(source: TensorProxy, steps: list[BoundSymbol], repeated: TensorProxy) -> TensorProxy | None:
    """``source`` if the primitives ``steps`` (broadcasts, then at most one reshape) make ``repeated`` from
    it by repeating its heads (dim 1) in place: ``repeat_kv``, ``repeat_interleave(n, dim=1)``, or a
    broadcast of a single key/value head to all query heads."""
    if source.ndim != 4 or repeated.ndim != 4:
        return None
    current, dims = source, tuple(range(4))  # source dim i -> dim dims[i] of current
    reshaped = False
    for step in steps:
        if not step.args or not _same(step.args[0], current) or reshaped:
            return None
        if step.sym.id == prims.PrimIDs.BROADCAST_IN_DIM:
            dims = tuple(int(step.args[2][d]) for d in dims)
        elif step.sym.id == prims.PrimIDs.RESHAPE:
            reshaped = True
        else:
            return None
        current = step.output
    if not _same(current, repeated):
        return None
    batch, kv, length, head_dim = source.shape
    if not reshaped:  # a broadcast of one key/value head to every query head
        if _fixed(kv) == 1 and dims == (0, 1, 2, 3) and repeated.ndim == 4:
            out = repeated.shape
            if all(_same_size(a, b) for a, b in zip((batch, length, head_dim), (out[0], out[2], out[3]))):
                return source
        return None
    # expand(b, kv, n, L, d) then reshape(b, kv * n, L, d): the reshape's other sizes are the source's, so
    # its heads are kv * n whatever the sizes (a reshape keeps the number of elements).
    expanded = steps[-1].args[0]
    if expanded.ndim != 5 or dims != (0, 1, 3, 4):
        return None
    kept = (batch, kv, length, head_dim)
    if not all(_same_size(expanded.shape[d], s) for d, s in zip(dims, kept)):
        return None
    out = repeated.shape
    if not all(_same_size(a, b) for a, b in zip((batch, length, head_dim), (out[0], out[2], out[3]))):
        return None
    return source


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
        if (grouped := _as_repeat(current, steps, repeated)) is not None:
            return _RepeatedHeads(grouped, tuple(repeat_ops))
    return None


def _query_matches(query, grouped: TensorProxy, repeated: TensorProxy) -> bool:
    """A 4-D ``query`` with the batch and the heads of the repeated key (checked by the sdpa/matmul meta)."""
    return (
        isinstance(query, TensorProxy)
        and query.ndim == 4
        and int(query.shape[0]) == int(grouped.shape[0])
        and int(query.shape[1]) == int(repeated.shape[1])
    )


def _fold(a: TensorProxy, kv) -> TensorProxy:
    """``a`` [B, kv * n_rep, M, K] as [B, kv, n_rep * M, K]: each group's heads as its rows."""
    batch, _, _, inner = a.shape
    return ltorch.reshape(a, (batch, kv, -1, inner))


def _unfold(out: TensorProxy, like: TensorProxy) -> TensorProxy:
    batch, heads, rows, _ = like.shape
    return ltorch.reshape(out, (batch, heads, rows, out.shape[-1]))


def _mask_folds(attn_mask) -> bool:
    """Whether ``attn_mask`` broadcasts over the folded rows as it is: the same for every head and row."""
    if attn_mask is None:
        return True
    if not isinstance(attn_mask, TensorProxy) or attn_mask.ndim > 4:
        return False
    return all(_fixed(s) == 1 for s in attn_mask.shape[:-1][-2:])


_SDPA_SIGNATURE = inspect.signature(ltorch.scaled_dot_product_attention.meta)


def _sdpa_rewrite(bsym: BoundSymbol, producers: dict[str, BoundSymbol], fold: bool):
    """``(replacement maker, repeat ops)`` for an attention over repeated heads, or ``None``: to the folded
    form (``fold``, where the mask folds), else to ``enable_gqa=True`` on CPU."""
    try:
        call = _SDPA_SIGNATURE.bind(*bsym.args, **bsym.kwargs)
    except TypeError:
        return None
    call.apply_defaults()
    args = call.arguments
    query, key, value, attn_mask = args["query"], args["key"], args["value"], args["attn_mask"]
    if not (isinstance(key, TensorProxy) and isinstance(value, TensorProxy)):
        return None
    # Dropout stays on the path it was on; with enable_gqa already set there is no repeat to remove.
    if args["dropout_p"] != 0 or args["enable_gqa"] is not False:
        return None
    on_cpu = isinstance(query, TensorProxy) and query.device.devicetype is devices.DeviceType.CPU
    to_enable_gqa = on_cpu and CPU_ENABLE_GQA_IS_BITWISE
    # "fold" takes precedence where it applies: on CPU the kernel then reads each key/value head once, where
    #   with enable_gqa it reads it once per query head of the group.
    to_fold = fold and args["is_causal"] is False and _mask_folds(attn_mask)
    if not (to_fold or to_enable_gqa):
        return None
    key_repeat, value_repeat = _find_repeat(key, producers), _find_repeat(value, producers)
    if key_repeat is None or value_repeat is None or not _query_matches(query, key_repeat.grouped, key):
        return None
    # Key and value are separate inputs (separate proxies under symbolic values): their groupings are compared
    # by value here, and the kernel checks them on every call, as it did for the repeated heads.
    if [int(s) for s in key_repeat.grouped.shape[:2]] != [int(s) for s in value_repeat.grouped.shape[:2]]:
        return None

    def gqa_replacement():
        return ltorch.scaled_dot_product_attention(
            query,
            key_repeat.grouped,
            value_repeat.grouped,
            attn_mask,
            0.0,
            args["is_causal"],
            scale=args["scale"],
            enable_gqa=True,
        )

    def replacement():
        grouped_key = key_repeat.grouped
        folded = _fold(query, grouped_key.shape[1])
        out = ltorch.scaled_dot_product_attention(
            folded, grouped_key, value_repeat.grouped, attn_mask, 0.0, False, scale=args["scale"]
        )
        return _unfold(out, query)

    return (replacement if to_fold else gqa_replacement), key_repeat.repeat_ops + value_repeat.repeat_ops


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
    if found is None or not _query_matches(a, found.grouped, repeated):
        return None

    def replacement():
        right = ltorch.transpose(found.grouped, 2, 3) if transposed else found.grouped
        return _unfold(ltorch.matmul(_fold(a, found.grouped.shape[1]), right), a)

    return replacement, transpose_ops + found.repeat_ops


class GroupedQueryAttentionTransform(Transform):
    """Attention over key/value heads repeated for grouped-query attention reads the grouped heads (see
    :mod:`thunder.transforms.grouped_query_attention`).

    ``thunder.jit`` runs it before the alias pass as its compile option ``grouped_query_attention``
    chooses. Passed in ``transforms=`` it runs after the alias pass, where a repeat that an alias update
    reads stays alive.

    Args:
        fold: fold query heads into rows wherever the mask allows (``"fold"``): attention on any device
            (``enable_gqa`` on CPU where it does not fold) and the matmuls of a written-out attention;
            changes the last bits of the result against the repeated heads'.
    """

    def __init__(self, *, fold: bool = False):
        self.fold = fold

    def transform_traces_pre_prologue(
        self, prologue_trace: TraceCtx, computation_trace: TraceCtx, epilogue_trace: TraceCtx | None, **kwargs
    ):
        return prologue_trace, self.transform_computation_trace(computation_trace), epilogue_trace

    def _rewrite(self, bsym: BoundSymbol, producers: dict[str, BoundSymbol]):
        if bsym.sym.id == ltorch.scaled_dot_product_attention.id:
            return _sdpa_rewrite(bsym, producers, self.fold)
        if bsym.sym.id == ltorch.matmul.id and self.fold:
            return _matmul_rewrite(bsym, producers)
        return None

    def transform_computation_trace(self, trace: TraceCtx) -> TraceCtx:
        """``trace`` rewritten, or ``trace`` itself when it has no attention over repeated heads."""
        producers: dict[str, BoundSymbol] = {}
        rewrites: dict[int, tuple] = {}  # index of the bound symbol -> (replacement maker, repeat ops)
        for index, bsym in enumerate(trace.bound_symbols):
            if (rewrite := self._rewrite(bsym, producers)) is not None:
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
        new_trace.set_provenance(TraceProvenance(f"{type(self).__name__} (no repeated key/value heads)"))
        return new_trace

    def __repr__(self) -> str:
        return f"{type(self).__module__}.{type(self).__name__}(fold={self.fold})"


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
