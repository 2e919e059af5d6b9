"""Find the in-place indexed writes into graph inputs that ThunderFX gives to Inductor.

Under ``inplace_indexed_writes="inplace"`` (the default) and ``"functional"`` Thunder runs every in-place
indexed write itself (see :mod:`thunder.torch` ``_indexed_write_``), and nothing here is used. Under
``"inductor"`` the splitter gives Inductor the writes that Inductor updates in place: a write whose
destination *is* a graph input (a placeholder, which includes the parameters and buffers Dynamo lifts to
inputs) and whose op Inductor re-inplaces (:data:`INDUCTOR_REINPLACED_WRITES`). Everything else stays in
Thunder, which writes it in place too. Measured with ``torch.compile(backend="inductor")`` on 256 MiB
buffers (peak memory of one call, CPU), Inductor copies the whole destination for ``scatter_``,
``scatter_add_``, ``scatter_reduce_``, ``index_fill_``, ``masked_fill_`` and ``masked_scatter_``, and the
whole viewed slice for a write through a view of an input (``cache[1][loc] = k``); routing those would
trade Thunder's in-place write for Inductor's copy.

Example (``buf[loc] = k``, ``buf`` a graph input, ``inplace_indexed_writes="inductor"``)::

    # Before
    class GraphModule(torch.nn.Module):
        def forward(self, L_buf_: "f32[64, 4]", L_loc_: "i64[1]", L_k_: "f32[1, 4]"):
            l_buf_[l_loc_] = l_k_
            return ()

    # After the split: the write is its own Inductor segment, which updates the caller's tensor.
    class GraphModule(torch.nn.Module):
        def forward(self, l_buf_: "f32[64, 4]", l_loc_: "i64[1]", l_k_: "f32[1, 4]"):
            inductor_0 = self.inductor_0(l_buf_, l_loc_, l_k_)
            return ()

A write through a view (``cache[1][loc] = k``) or into an intermediate is not routed: the graph is
unchanged and Thunder's segment holds ``setitem_`` on the view.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from thunder.core import prims
import thunder.torch as ltorch

__all__ = [
    "INDUCTOR_REINPLACED_WRITES",
    "IndexedWrite",
    "find_aliased_writes_under_grad",
    "find_indexed_writes_on_inputs",
    "indexed_write_op_name",
]


def _torch_names_of_inplace_indexed_writes() -> dict[object, str]:
    """Every torch callable that thunder.torch lowers as an in-place indexed write, mapped to its name."""
    symbols = set(ltorch.inplace_indexed_writes)
    targets: dict[object, str] = {operator.setitem: "__setitem__"}
    for fn, symbol in ltorch._torch_to_thunder_function_map.items():
        if symbol in symbols:
            targets[fn] = fn.__name__
    return targets


_TARGETS = _torch_names_of_inplace_indexed_writes()
_NAMES = frozenset(_TARGETS.values())

#: The in-place indexed writes Inductor updates in place when their destination is a graph input: its
#: reinplace pass (torch/_inductor/fx_passes/reinplace.py) turns them into one ``index_put_``-style kernel
#: on the input; ``__setitem__`` only for the keys of :func:`_inductor_writes_key_in_place`. Checked by
#: tests that measure the peak memory of each routed form.
INDUCTOR_REINPLACED_WRITES: frozenset[str] = frozenset({"__setitem__", "index_copy_", "index_put_", "index_add_"})


def _is_tensor(x: object) -> bool:
    return _example_value(x) is not None


def _inductor_writes_key_in_place(key: object) -> bool:
    """Whether Inductor writes ``destination[key] = value`` into the destination itself.

    Measured with ``torch.compile(backend="inductor")`` (peak memory of one call, 64 MiB destination): a key
    without tensors (ints, slices, ``None``, ``...``: a view and a copy into it) and a key whose other entries
    are full slices or ``...`` (``b[loc]``, ``b[:, loc]``, ``b[..., loc]``, ``b[loc, :]``, ``b[loc1, loc2]``)
    are written in place. Mixed with an int, a partial slice or ``None`` (``b[1, loc]``, ``b[loc, 1]``,
    ``b[2:6, loc]``, ``b[loc, :16]``, ``b[None, loc]``), Inductor copies the indexed view (half the buffer
    for ``cache[1, loc]`` on a two-layer cache) or the whole destination.
    """
    entries = key if isinstance(key, (tuple, list)) else (key,)
    if not any(_is_tensor(e) for e in entries):
        return True
    return all(_is_tensor(e) or e is Ellipsis or e == slice(None) for e in entries)


def indexed_write_op_name(node: torch.fx.Node) -> str | None:
    """The name of the in-place indexed write ``node`` calls (``"__setitem__"``, ``"index_copy_"``, ...), in
    any form (``operator.setitem``, Tensor method, ``torch`` function, ``aten`` overload), or ``None``."""
    if node.op == "call_method":
        return node.target if node.target in _NAMES else None
    if node.op != "call_function":
        return None
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        target = target.overloadpacket
    if isinstance(target, torch._ops.OpOverloadPacket):
        return target.__name__ if target.__name__ in _NAMES else None
    try:
        return _TARGETS.get(target)
    except TypeError:  # unhashable target
        return None


@dataclass(frozen=True)
class IndexedWrite:
    """An in-place indexed write whose destination is the graph input ``graph_input`` itself."""

    node: torch.fx.Node
    op_name: str
    graph_input: torch.fx.Node

    def describe(self) -> str:
        return (
            f"node with name: {self.node.name} and target: {self.op_name} writes in place by index into graph "
            f"input {self.graph_input.name}; routed to Inductor, which updates the caller's tensor in place"
        )


def find_indexed_writes_on_inputs(gm: torch.fx.GraphModule) -> list[IndexedWrite]:
    """The in-place indexed writes in ``gm`` whose destination is a graph input and which Inductor
    updates in place (:data:`INDUCTOR_REINPLACED_WRITES`).

    The write is left to Thunder, which orders the aliases, when the destination has an alias in the graph
    before the write: another input that shares its storage (``f(buf, buf[:, 2])``), or a view taken
    earlier (``t = buf[6]; buf[:, 6:7] = v``). The split would hand Inductor's segment the input and its
    alias as two arguments, and Inductor mishandles that: it failed with "tensor does not have a device"
    or "incorrect out shape after application of ViewMeta sequence", or returned a view of the wrong
    strides (fuzzer seed 1053, a transposed input).
    """
    inputs = [n for n in gm.graph.nodes if n.op in ("placeholder", "get_attr")]
    storages = [_storage(v) if (v := _example_value(n)) is not None else None for n in inputs]
    known = [s for s in storages if s is not None]  # not SymInt inputs, which have no storage
    aliased = {n for n, s in zip(inputs, storages) if s is not None and known.count(s) > 1}
    writes = []
    storages_with_views: set[StorageWeakRef] = set()  # storages of the inputs some earlier node aliases
    input_storages = {s for s in storages if s is not None}
    for node in gm.graph.nodes:
        op_name = indexed_write_op_name(node)
        destination = node.args[0] if op_name in INDUCTOR_REINPLACED_WRITES and node.args else None
        if op_name == "__setitem__" and len(node.args) > 1 and not _inductor_writes_key_in_place(node.args[1]):
            destination = None
        if (
            isinstance(destination, torch.fx.Node)
            and destination in inputs
            and destination not in aliased
            and (value := _example_value(destination)) is not None
            and _storage(value) not in storages_with_views
        ):
            writes.append(IndexedWrite(node, op_name, destination))
            if not node.users:  # its result (the destination itself) is never used: no new alias
                continue
        if node.op not in ("placeholder", "get_attr"):
            for value in _example_values(node):  # every result: split() and unbind() make several views
                if (storage := _storage(value)) in input_storages:
                    storages_with_views.add(storage)
    return writes


def _example_value(node: object) -> torch.Tensor | None:
    value = node.meta.get("example_value", node.meta.get("val")) if isinstance(node, torch.fx.Node) else None
    return value if isinstance(value, torch.Tensor) else None


def _example_values(node: torch.fx.Node) -> list[torch.Tensor]:
    value = node.meta.get("example_value", node.meta.get("val"))
    return [v for v in torch.utils._pytree.tree_leaves(value) if isinstance(v, torch.Tensor)]


def _storage(value: torch.Tensor) -> StorageWeakRef | None:
    try:
        return StorageWeakRef(value.untyped_storage())
    except (NotImplementedError, RuntimeError):  # e.g. tensor subclasses without a storage
        return None


def _thunder_symbol(node: torch.fx.Node):
    if node.op == "call_method":
        target = getattr(torch.Tensor, node.target, None)
    elif node.op == "call_function":
        target = node.target
    else:
        return None
    try:
        return ltorch._torch_to_thunder_function_map.get(target)
    except TypeError:  # unhashable target
        return None


def _in_place_op_name(node: torch.fx.Node) -> str | None:
    """The name of the Thunder in-place op (tagged IN_PLACE: ``mul_``, ``zero_``, ...; or ``copy_``, a write of its
    source, untagged) that ``node`` calls."""
    symbol = _thunder_symbol(node)
    if symbol is None:
        return None
    if symbol is ltorch.copy_ or prims.OpTags.IN_PLACE in (getattr(symbol, "tags", None) or ()):
        return symbol.name
    return None


def find_aliased_writes_under_grad(gm: torch.fx.GraphModule) -> dict[torch.fx.Node, str]:
    """The nodes that run as eager PyTorch because a gradient flows through an in-place indexed write (or, with an
    alias read after it, another in-place op such as ``mul_``) into their
    storage which leaves an alias of it, made before the write, to be read after it, or which is a graph
    input that requires grad; each with why.

    Those are the nodes from the first whose value shares that storage (the base, its views, the writes) to
    the last, in one segment that the splitter does not compile: it runs the FX nodes as they are, under
    autograd, so values, errors on bad input and gradients are eager's (Inductor's gradient was eager's too,
    but its kernels accept indices eager rejects, such as -1 for ``index_copy_``, and views passed between two
    compiled segments went wrong in AOT's replay of the write). thunder.jit makes most such aliases again
    from the written tensor (thunder.torch.indexed_writes.rebase_views_after_differentiable_writes), but a
    segment sees the views only when they are made inside it (an alias passed in from an earlier segment has
    no view relation), and some it refuses (views by ``reshape``, arguments that require grad); leaving the
    storage's nodes together out of Thunder keeps Thunder segments free of such writes. A write whose aliases
    are read only before it stays in Thunder (the functional lowering). Nothing here raises: a node it
    declines runs eagerly with a split reason.

    Before (``y = x * 1; v = y.view(-1); y[0] = w; return (v * v).sum()``, ``x``, ``w`` requiring grad)::

        mul = l_x_ * 1
        v = mul.view(-1)
        mul[0] = l_w_
        mul_1 = v * v;  sum_1 = mul_1.sum()

    After the split: ``eager_0`` makes ``mul`` and ``v`` and writes (its outputs are eager's views of
    ``mul``, with the write in their history); ``thunder_1`` reads ``v``.
    """
    nodes = list(gm.graph.nodes)
    order = {n: i for i, n in enumerate(nodes)}
    # Storage classes: nodes whose values share storage, and the nodes Thunder takes for views whatever
    #   their strides (reshape, contiguous, ...), with their first argument.
    parent: dict[object, object] = {}

    def find(key):
        while (p := parent.get(key, key)) is not key:
            parent[key] = parent.get(p, p)
            key = p
        return key

    def union(a, b):
        parent[find(a)] = find(b)

    storages: dict[StorageWeakRef, StorageWeakRef] = {}  # one key object per storage: find() compares by identity
    for node in nodes:
        for value in _example_values(node):
            if (storage := _storage(value)) is not None:
                union(node, storages.setdefault(storage, storage))
        if _thunder_symbol(node) in ltorch._syms_that_may_return_views and node.args:
            if isinstance(node.args[0], torch.fx.Node):
                union(node, node.args[0])

    # A node's value may require grad if its example value does, or it is made from one that may.
    may_require_grad: set[torch.fx.Node] = set()
    for node in nodes:
        values = _example_values(node)
        if any(v.requires_grad for v in values) or (
            any(v.is_floating_point() or v.is_complex() for v in values)
            and any(a in may_require_grad for a in node.all_input_nodes)
        ):
            may_require_grad.add(node)
    grad_classes = {find(n) for n in may_require_grad}

    routed: dict[torch.fx.Node, str] = {}
    # Dynamo compiles a frame under the grad mode it runs in, and records changes of it as nodes.
    grad_enabled = torch.is_grad_enabled()
    for node in nodes:
        if node.op == "call_function" and node.target is torch._C._set_grad_enabled:
            grad_enabled = bool(node.args[0])
            continue
        op_name = indexed_write_op_name(node)
        # Other in-place ops (mul_, add_, zero_, ...) that leave an alias read after them: thunder.jit makes such
        #   views again too, but refuses aliases it cannot make (reshape views, arguments sharing storage).
        other_write = op_name is None and (op_name := _in_place_op_name(node)) is not None
        destination = node.args[0] if op_name is not None and node.args else None
        if not grad_enabled or not isinstance(destination, torch.fx.Node) or not _example_values(destination):
            continue
        storage_class = find(destination)
        if storage_class not in grad_classes and not any(a in may_require_grad for a in node.all_input_nodes):
            continue
        stale = [
            n
            for n in nodes[: order[node]]
            if n is not destination
            and find(n) is storage_class
            and not _is_same_tensor(n, destination)
            and any(order[u] > order[node] for u in n.users)
        ]
        # A graph input that requires grad: Thunder's autograd.Function does not tell PyTorch that it writes it
        #   (mark_dirty), so the input's own gradient (of the elements it keeps) would be lost.
        written_inputs = [
            n
            for n in nodes
            if n.op == "placeholder" and find(n) is storage_class and any(v.requires_grad for v in _example_values(n))
        ]
        if stale:
            why = f"whose alias {stale[0].name} is read after the write"
        elif written_inputs and not other_write:
            why = f"which is (a view of) the graph input {written_inputs[0].name} that requires grad"
        else:
            continue
        reason = (
            f"node with name: {node.name} and target: {op_name} writes in place, where a gradient flows, into "
            f"{destination.name}, {why}; the nodes of that storage run as eager PyTorch (values, errors and gradients are eager's)"
        )
        # The nodes of the storage (a write's node has no value of its own: operator.setitem returns None),
        #   and every node between them, so that its views do not pass between Inductor segments.
        members = [
            order[n]
            for n in nodes
            if n.op.startswith("call_")
            and (
                find(n) is storage_class
                or (indexed_write_op_name(n) is not None and n.args and find(n.args[0]) is storage_class)
            )
        ]
        for n in nodes[min(members) : max(members) + 1]:
            if n.op.startswith("call_"):
                routed.setdefault(n, reason)
    return routed


def _is_same_tensor(node: torch.fx.Node, other: torch.fx.Node) -> bool:
    """Whether ``node`` is the result of an in-place op on ``other`` (Dynamo records the same tensor)."""
    values, others = _example_values(node), _example_values(other)
    return len(values) == 1 and len(others) == 1 and values[0] is others[0]
