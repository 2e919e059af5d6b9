"""Find in-place indexed writes into graph inputs in a Dynamo graph and route them out of Thunder.

Why: Thunder lowers ``buf[idx] = v`` (and ``index_copy_``, ``index_put_``, ``scatter_``, ...) to a
functional op that clones the whole destination, followed by ``copy_`` of the whole result back into
it. For a KV cache of a few GB that is four full passes over the cache to write one row. Inductor
functionalizes too, but re-inplaces the write into the caller's tensor
(``torch/_inductor/fx_passes/reinplace.py``), so it moves only the written bytes. Until Thunder writes
such ops in place itself, the splitter gives these nodes to Inductor.

What counts as such a write: a node whose target is one of :data:`INDEXED_WRITE_OPS` (in its
``operator.setitem``, ``Tensor`` method, ``torch`` function or ``aten`` overload form) and whose
destination (first argument) shares storage with a graph input: a placeholder, which includes the
parameters and buffers Dynamo lifts to inputs, or a view of one. A write into an intermediate moves
no caller-visible bytes twice and stays in Thunder.

The view chain matters. In ``cache[layer][loc] = k`` the destination is ``getitem(cache, layer)``.
If the ``getitem`` stayed in a Thunder segment and only the ``setitem`` went to Inductor, Inductor
would receive a Thunder *output* rather than a view of ``cache`` and the write could land in a copy.
So the chain from the input to the destination is re-created right before the write, and the copy is
routed together with the write; the original view nodes stay where they were for any other users
(view ops are free, so computing one twice costs nothing).

Example (``cache[1][loc] = k``, ``cache`` a graph input)::

    # Before
    class GraphModule(torch.nn.Module):
        def forward(self, L_cache_: "f32[2, 16, 4]", L_loc_: "i64[1]", L_k_: "f32[1, 4]"):
            getitem = l_cache_[1]
            getitem[l_loc_] = l_k_
            return ()

    # After rematerialize_write_view_chains + the split: one Inductor segment holds the chain and
    # the write, so the write lands in the caller's storage.
    class GraphModule(torch.nn.Module):
        def forward(self, l_cache_: "f32[2, 16, 4]", l_loc_: "i64[1]", l_k_: "f32[1, 4]"):
            inductor_1 = self.inductor_1(l_cache_, l_loc_, l_k_)
            return ()

        class inductor_1(torch.nn.Module):
            def forward(self, l_cache_, l_loc_, l_k_):
                getitem_1 = l_cache_[1]
                getitem_1[l_loc_] = l_k_
                return ()
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import torch
from torch.multiprocessing.reductions import StorageWeakRef

__all__ = [
    "INDEXED_WRITE_OPS",
    "INPLACE_INDEXED_WRITES_POLICIES",
    "IndexedWrite",
    "check_inplace_indexed_writes_policy",
    "find_indexed_writes_on_inputs",
    "rematerialize_write_view_chains",
    "thunder_jit_policy",
    "writes_to_route",
]

#: In-place ops that write a subset of their destination selected by an index, key or mask.
#: ``masked_fill_``/``masked_scatter_`` are included: they too write only where the mask is set,
#: and Thunder's functional lowering of them copies the whole destination twice.
INDEXED_WRITE_OPS: tuple[str, ...] = (
    "__setitem__",
    "index_copy_",
    "index_put_",
    "index_add_",
    "index_fill_",
    "scatter_",
    "scatter_add_",
    "scatter_reduce_",
    "masked_fill_",
    "masked_scatter_",
)

#: The subset Thunder itself lowers to in-place prims (``prims.setitem_``, ``prims.index_copy_``, ...;
#: see thunder/core/inplace_indexed_writes.py). Under ``inplace_indexed_writes="inplace"`` only the
#: other ops are routed to Inductor.
THUNDER_INPLACE_OPS: frozenset[str] = frozenset(
    {"__setitem__", "index_copy_", "index_put_", "index_add_", "scatter_", "scatter_add_"}
)

#: Values of ``ThunderCompiler(inplace_indexed_writes=...)``:
#: ``"inplace"`` (default): Thunder writes in place itself; ops it cannot (``index_fill_``,
#: ``scatter_reduce_``, ``masked_fill_``, ``masked_scatter_``) are routed to Inductor;
#: ``"inductor"``: every indexed write into a graph input is routed to Inductor;
#: ``"functional"``: stock behaviour, Thunder runs them as functional op + full copy back.
INPLACE_INDEXED_WRITES_POLICIES: tuple[str, ...] = ("inplace", "inductor", "functional")


def writes_to_route(writes: list[IndexedWrite], policy: str) -> list[IndexedWrite]:
    """The writes the splitter gives to Inductor under ``policy``."""
    if policy == "inductor":
        return writes
    if policy == "inplace":
        return [w for w in writes if w.op_name not in THUNDER_INPLACE_OPS]
    return []

_FUNCTION_TARGETS: dict[object, str] = {operator.setitem: "__setitem__"}
for _name in INDEXED_WRITE_OPS:
    if hasattr(torch.Tensor, _name):
        _FUNCTION_TARGETS[getattr(torch.Tensor, _name)] = _name
    if hasattr(torch, _name):
        _FUNCTION_TARGETS[getattr(torch, _name)] = _name
del _name


def check_inplace_indexed_writes_policy(policy: str, allowed: tuple[str, ...] = INPLACE_INDEXED_WRITES_POLICIES) -> str:
    if policy not in allowed:
        raise ValueError(
            f"inplace_indexed_writes={policy!r} is not supported; expected one of {', '.join(map(repr, allowed))}"
        )
    return policy


def thunder_jit_policy(policy: str) -> str:
    """The ``thunder.jit`` option ``inplace_indexed_writes`` for the segments of a ThunderFX policy:
    writes left in Thunder are lowered in place unless the policy is the stock ``"functional"``."""
    return "functional" if policy == "functional" else "inplace"


def indexed_write_op_name(node: torch.fx.Node) -> str | None:
    """The op name from :data:`INDEXED_WRITE_OPS` that ``node`` calls, in any form, or ``None``."""
    if node.op == "call_method":
        return node.target if node.target in INDEXED_WRITE_OPS else None
    if node.op != "call_function":
        return None
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        target = target.overloadpacket
    if isinstance(target, torch._ops.OpOverloadPacket):
        name = target.__name__
        return name if name in INDEXED_WRITE_OPS else None
    try:
        return _FUNCTION_TARGETS.get(target)
    except TypeError:  # unhashable target
        return None


def _storage(node: object) -> StorageWeakRef | None:
    if not isinstance(node, torch.fx.Node):
        return None
    value = node.meta.get("example_value", node.meta.get("val"))
    if not isinstance(value, torch.Tensor):
        return None
    try:
        return StorageWeakRef(value.untyped_storage())
    except (NotImplementedError, RuntimeError):  # e.g. tensor subclasses without a storage
        return None


@dataclass(frozen=True)
class IndexedWrite:
    """An in-place indexed write whose destination is (a view of) the graph input ``graph_input``.

    ``view_chain`` lists the nodes between the input and the destination, input side first; it is
    empty when the write targets the input itself.
    """

    node: torch.fx.Node
    op_name: str
    graph_input: torch.fx.Node
    view_chain: tuple[torch.fx.Node, ...]

    def describe(self) -> str:
        via = "".join(f" via {n.name} ({getattr(n.target, '__name__', n.target)})" for n in self.view_chain)
        return (
            f"node with name: {self.node.name} and target: {self.op_name} writes in place by index into graph "
            f"input {self.graph_input.name}{via}; routed to Inductor, which updates the caller's tensor in place, "
            f"where Thunder's functional lowering would clone and copy back the whole tensor"
        )


#: Tensor methods and ``torch`` functions that return a view of their first argument without writing
#: anything. Only these may sit in the view chain moved with a routed write: the chain is re-created next
#: to the write, so anything with an effect (``x = buf.add_(1)``) would run twice.
PURE_VIEW_OPS: frozenset[str] = frozenset(
    {
        "view", "view_as", "reshape", "reshape_as", "select", "narrow", "transpose", "swapaxes", "swapdims",
        "t", "permute", "movedim", "moveaxis", "squeeze", "unsqueeze", "expand", "expand_as", "flatten",
        "unflatten", "diagonal", "as_strided", "unfold", "detach", "alias", "view_as_real", "view_as_complex",
        "real", "imag", "adjoint",
    }
)


def _is_pure_view(node: torch.fx.Node) -> bool:
    """Whether ``node`` only makes a view of its first argument (no write, no copy of data)."""
    if node.op == "call_method":
        return node.target in PURE_VIEW_OPS
    if node.op != "call_function":
        return False
    target = node.target
    if target is operator.getitem:
        # Basic indexing (ints, slices, None, Ellipsis) is a view; a tensor or list key is a gather.
        key = node.args[1] if len(node.args) > 1 else None
        return not any(isinstance(k, (torch.fx.Node, list)) for k in (key if isinstance(key, tuple) else (key,)))
    if isinstance(target, torch._ops.OpOverload):
        # aten: a non-mutable schema whose output aliases an input (aten.select.int, aten.view.default, ...)
        schema = target._schema
        return not schema.is_mutable and any(r.alias_info is not None for r in schema.returns)
    name = getattr(target, "__name__", None)
    return name in PURE_VIEW_OPS and (getattr(torch, name, None) is target or getattr(torch.Tensor, name, None) is target)


def _view_chain_to_input(dest: torch.fx.Node, inputs: dict[StorageWeakRef, torch.fx.Node]):
    """Walk from ``dest`` back to the graph input it aliases, through first tensor arguments that
    share its storage. Returns ``(input, chain)``, or ``None`` if ``dest`` aliases no input or the
    path to it holds anything but pure view ops (:func:`_is_pure_view`): such a write stays in Thunder."""
    storage = _storage(dest)
    if storage is None or storage not in inputs:
        return None
    chain: list[torch.fx.Node] = []
    node = dest
    while node.op not in ("placeholder", "get_attr"):
        if not _is_pure_view(node):
            # E.g. ``x = buf.add_(1); x[loc] = k``: re-creating ``x`` next to the write would add 1 twice.
            return None
        chain.append(node)
        parent = next((a for a in node.all_input_nodes if _storage(a) == storage), None)
        if parent is None:
            # Aliases an input through something we cannot re-create (e.g. a tensor subclass or an
            # op without example values): treat it as an intermediate and leave it to Thunder.
            return None
        node = parent
    return node, tuple(reversed(chain))


def find_indexed_writes_on_inputs(gm: torch.fx.GraphModule) -> list[IndexedWrite]:
    """All in-place indexed writes in ``gm`` whose destination aliases a graph input."""
    inputs: dict[StorageWeakRef, torch.fx.Node] = {}
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "get_attr"):
            storage = _storage(node)
            if storage is not None:
                inputs.setdefault(storage, node)
    if not inputs:
        return []
    writes = []
    for node in gm.graph.nodes:
        op_name = indexed_write_op_name(node)
        if op_name is None or not node.args:
            continue
        found = _view_chain_to_input(node.args[0], inputs)
        if found is not None:
            writes.append(IndexedWrite(node, op_name, found[0], found[1]))
    return writes


def rematerialize_write_view_chains(gm: torch.fx.GraphModule, writes: list[IndexedWrite]) -> list[IndexedWrite]:
    """Give each write its own copy of its view chain, placed right before it, so that a split puts
    the chain in the write's segment. Original view nodes left without users are removed.

    Returns the writes with ``view_chain`` pointing at the new nodes.
    """
    graph = gm.graph
    result = []
    for write in writes:
        if not write.view_chain:
            result.append(write)
            continue
        replacement: dict[torch.fx.Node, torch.fx.Node] = {}
        with graph.inserting_before(write.node):
            for old in write.view_chain:
                new = graph.node_copy(old, lambda n: replacement.get(n, n))
                new.meta = dict(old.meta)
                replacement[old] = new
        write.node.replace_input_with(write.view_chain[-1], replacement[write.view_chain[-1]])
        for old in reversed(write.view_chain):
            if not old.users:
                graph.erase_node(old)
        result.append(IndexedWrite(write.node, write.op_name, write.graph_input, tuple(replacement.values())))
    if writes:
        gm.recompile()
    return result
