"""What the bound symbols of a trace write in place, which proxies alias, and the order that imposes.

After :func:`thunder.core.update_aliases.insert_alias_updates` a trace is functional except for its
in-place writes: ``prims.copy_``, the ops tagged ``OpTags.IN_PLACE`` (the in-place prims, and the torch
in-place ops before they are decomposed) and the composites and fusions that contain them. A read that
follows a write names a new proxy (an ``update_aliases`` output or the write's own output), so it has a data
edge to the write. A read that *precedes* a write has none: nothing but the trace's order says it must run
first. Every pass that moves or merges bound symbols has to keep that order; this module is the one place
that computes it:

* :func:`written_tensors` -- the arguments a bound symbol writes;
* :class:`AliasSets` -- the proxies that may share storage (connected by ``update_aliases``, by a write and
  its output, and by view creation), as a union-find over proxy names;
* :func:`names_sharing_written_storage` -- the tensors whose storage is written somewhere in a trace (CSE
  must not merge two of them: ``zeros(4)`` twice, then a different write into each);
* :func:`storage_order_edges` -- the pairs ``(i, j)`` of bound symbols, ``i < j``, that must stay in that
  order because both touch one storage and at least one of them writes it.

Example, the trace of ``s = (buf * 2).sin(); buf[loc] = k; return s + y``::

    (t9,) = update_aliases((buf,))
    t0 = mul(t9, 2)              # reads t9
    s = sin(t0)
    (t10,) = update_aliases((t9,))
    t11 = setitem_(t10, loc, k)  # writes t10: t9, t10 and t11 are one storage
    t3 = add(s, y)

``storage_order_edges`` gives ``(1, 4)`` (``mul`` reads the storage ``setitem_`` writes), which no data edge
implies. Without it, rematerialization recomputed ``mul`` and ``sin`` inside the fusion of ``add``, after the
write; dataflow fusion could schedule them there too.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from thunder.core import prims
from thunder.core.proxies import TensorProxy
from thunder.core.symbol import BoundSymbol, BoundSymbolTag

__all__ = [
    "written_tensors",
    "writes_in_place",
    "is_view_creation",
    "AliasSets",
    "storage_order_edges",
    "names_sharing_written_storage",
    "VIEW_OF_WRITTEN_STORAGE",
]

# The tag of a view of a storage the trace writes in place, made by an operator executor: a fusion's outputs are
#   new tensors, so no fusion executor may take it (thunder.executors.passes sets it, Executor.can_fuse reads it).
BoundSymbolTag.register_tag("VIEW_OF_WRITTEN_STORAGE")
VIEW_OF_WRITTEN_STORAGE = BoundSymbolTag.VIEW_OF_WRITTEN_STORAGE

_COPY_IDS = (prims.PrimIDs.COPY_, "copy_")  # the prim, and the torch executor's operator for it
_UPDATE_ALIASES_IDS = (prims.PrimIDs.UPDATE_ALIASES, "update_aliases")


def _tensor_args(bsym: BoundSymbol) -> list[TensorProxy]:
    return [p for p in bsym.flat_proxy_args if isinstance(p, TensorProxy)]


def _tensor_outs(bsym: BoundSymbol) -> list[TensorProxy]:
    return [p for p in bsym.flat_proxy_outs if isinstance(p, TensorProxy)]


def written_tensors(bsym: BoundSymbol) -> tuple[TensorProxy, ...]:
    """The tensor arguments of ``bsym`` that it writes in place.

    ``prims.copy_(src, dst)`` writes ``dst``; a symbol tagged ``OpTags.IN_PLACE`` writes its first tensor
    argument; a composite or a fusion writes those of its arguments that one of its subsymbols writes, or
    writes an alias of made inside it (``ltorch.mul_`` is ``mul`` + ``copy_`` into its first argument; a
    fusion may hold several writes, and the ``update_aliases`` before them: ``TorchCompile1(buf)`` holding
    ``(t4,) = update_aliases((buf,)); copy_(t1, t4)`` writes ``buf``).
    """
    if bsym.sym.id in _COPY_IDS:
        args = _tensor_args(bsym)
        return (args[1],) if len(args) > 1 else ()
    if bsym.sym.tags and prims.OpTags.IN_PLACE in bsym.sym.tags:
        args = _tensor_args(bsym)
        return (args[0],) if args else ()
    if not bsym.subsymbols:
        return ()
    inner_written = [t for sub in bsym.subsymbols for t in written_tensors(sub)]
    if not inner_written:
        return ()
    inner = AliasSets(bsym.subsymbols)
    written_storages = inner.storages(inner_written)
    args = {p.name: p for p in _tensor_args(bsym)}
    return tuple(p for name, p in args.items() if inner.find(name) in written_storages)


def writes_in_place(bsym: BoundSymbol) -> bool:
    """Whether ``bsym`` writes one of its arguments in place."""
    return bool(written_tensors(bsym))


def is_view_creation(bsym: BoundSymbol) -> bool:
    """Whether ``bsym`` may return a view of its first argument (``ltorch`` ops that return or may return
    views; their prims, such as ``reshape`` and ``slice_prim``, are not views at the prim level)."""
    import thunder.torch as ltorch

    return bsym.sym in ltorch._syms_returning_views or bsym.sym in ltorch._syms_that_may_return_views


def _walk(bsyms: Iterable[BoundSymbol]) -> Iterable[BoundSymbol]:
    for bsym in bsyms:
        yield bsym
        if bsym.subsymbols:
            yield from _walk(bsym.subsymbols)


class AliasSets:
    """Union-find over proxy names: the tensors of ``bsyms`` that may share storage.

    Connected are the arguments and outputs of an ``update_aliases`` (a view group), the tensor a write
    writes and the write's output (the same storage under a new name), and a view and its base. Subsymbols
    are included, so the sets of a fused trace are those of the trace it was made from. Over-approximates:
    a false alias only costs a reordering that would have been valid.
    """

    def __init__(self, bsyms: Iterable[BoundSymbol] = ()):
        self._parent: dict[str, str] = {}
        for bsym in _walk(bsyms):
            if bsym.sym.id in _UPDATE_ALIASES_IDS:
                self.union(*(p.name for p in _tensor_args(bsym) + _tensor_outs(bsym)))
            elif bsym.subsymbols:
                continue  # its writes and views are among the subsymbols walked next
            elif written := written_tensors(bsym):
                self.union(*(p.name for p in (*written, *_tensor_outs(bsym))))
            elif (args := _tensor_args(bsym)) and is_view_creation(bsym):
                self.union(args[0].name, *(p.name for p in _tensor_outs(bsym)))

    def find(self, name: str) -> str:
        parent = self._parent
        root = name
        while (p := parent.get(root, root)) != root:
            root = p
        while name != root:  # path compression
            parent[name], name = root, parent[name]
        return root

    def union(self, *names: str) -> None:
        if not names:
            return
        first = self.find(names[0])
        for name in names[1:]:
            root = self.find(name)
            if root != first:
                self._parent[root] = first

    def storages(self, proxies: Iterable) -> set[str]:
        """The storage (set representative) of each tensor among ``proxies``."""
        return {self.find(p.name) for p in proxies if isinstance(p, TensorProxy)}


def storage_order_edges(bsyms: Sequence[BoundSymbol], alias_sets: AliasSets | None = None) -> list[tuple[int, int]]:
    """Pairs ``(i, j)``, ``i < j``, of indices into ``bsyms`` whose order a reordering pass must keep
    although no data edge connects them: ``j`` writes a storage that ``i`` read (the read must see the old
    value) or wrote (the later write wins); ``j`` reads or writes a storage that ``i`` wrote without naming
    ``i``'s output; ``i`` and ``j`` are consecutive writes, whatever they write (a write that raises on bad
    input, as eager's ``scatter_add_`` does on a negative index, stops the writes after it: none of them may
    run first); and ``j`` is the return and ``i`` a write (a write nothing reads must still run).

    The order of ``bsyms`` is the program's, which is correct by construction. Only the edges to the
    accesses since the previous write of a storage are listed; the rest follow by transitivity.
    """
    if not any(map(writes_in_place, bsyms)):
        return []
    alias_sets = alias_sets if alias_sets is not None else AliasSets(bsyms)
    last_write: dict[str, int] = {}
    reads_since_write: dict[str, list[int]] = {}
    writes: list[int] = []
    edges: list[tuple[int, int]] = []
    for j, bsym in enumerate(bsyms):
        if bsym.sym.id is prims.PrimIDs.RETURN:
            edges.extend((w, j) for w in writes)
            continue
        written = alias_sets.storages(written_tensors(bsym))
        touched = alias_sets.storages(bsym.flat_proxy_args) | written
        for storage in touched:
            if (w := last_write.get(storage)) is not None:
                edges.append((w, j))
        for storage in written:
            edges.extend((i, j) for i in reads_since_write.pop(storage, ()) if i != j)
            last_write[storage] = j
        for storage in touched - written:
            reads_since_write.setdefault(storage, []).append(j)
        if written:
            if writes:
                edges.append((writes[-1], j))
            writes.append(j)
    return edges


def names_sharing_written_storage(bsyms: Sequence[BoundSymbol]) -> set[str]:
    """The names of the tensors of ``bsyms`` (subsymbols included) whose storage one of ``bsyms`` writes in
    place. Two equal expressions among them are not one value: ``a = zeros(4); b = zeros(4); a[0] = 1``."""
    if not any(map(writes_in_place, bsyms)):
        return set()
    alias_sets = AliasSets(bsyms)
    written: set[str] = set()
    names: set[str] = set()
    for bsym in _walk(bsyms):
        written |= alias_sets.storages(written_tensors(bsym))
        names.update(p.name for p in (*_tensor_args(bsym), *_tensor_outs(bsym)))
    return {name for name in names if alias_sets.find(name) in written}
