"""ThunderFX and in-place indexed writes (the compile option ``inplace_indexed_writes``).

Under the default, ``"inplace"``, every write form stays in the Thunder segment and is written in place.
Under ``"inductor"`` the writes whose destination is a graph input and which Inductor updates in place
(``__setitem__``, ``index_copy_``, ``index_put_``, ``index_add_``) become Inductor segments; the rest stay
in Thunder. Every form is compared bitwise with eager (the caller's buffer after the call), and the peak
memory of one call (which sees copies inside Inductor segments too) must stay far below the buffer.
"""

from __future__ import annotations

import pytest
import torch
from expecttest import TestCase

import thunder
from thunder.dynamo import ThunderCompiler
from thunder.examine.full_size_copies import find_full_size_copies, peak_memory_growth


def _thunderfx(fn, **options):
    torch._dynamo.reset()
    backend = ThunderCompiler(**options)
    return torch.compile(fn, backend=backend), backend


def _split_reasons(backend) -> list[str]:
    return [r.reason_type.name for info in backend.subgraph_infos for r in (info.split_reasons or [])]


def _thunder_traces(backend):
    return [thunder.last_traces(fn)[-1] for info in backend.subgraph_infos for fn in info.thunder_compiled_fns]


def _full_copies(backend) -> list:
    return [c for trace in _thunder_traces(backend) for c in find_full_size_copies(trace)]


def _assert_same(expected, actual):
    e_leaves, a_leaves = torch.utils._pytree.tree_leaves(expected), torch.utils._pytree.tree_leaves(actual)
    assert len(e_leaves) == len(a_leaves)
    for e, a in zip(e_leaves, a_leaves):
        if isinstance(e, torch.Tensor):
            assert e.dtype == a.dtype and torch.equal(e, a), (e, a)
        else:
            assert e == a


def _cache(*shape, dtype=torch.float32):
    return torch.arange(torch.Size(shape).numel(), dtype=torch.float32).reshape(shape).to(dtype)


# (id, fn, make_args). Every destination is a graph input or a view of one.
WRITE_FORMS = [
    (
        "setitem_tensor_key",
        lambda b, i, v: b.__setitem__(i, v),
        lambda: (_cache(32, 4), torch.tensor([3, 7]), -torch.ones(2, 4)),
    ),
    ("setitem_int_key", lambda b, v: b.__setitem__(5, v), lambda: (_cache(32, 4), -torch.ones(4))),
    ("setitem_slice_key", lambda b, v: b.__setitem__(slice(2, 6), v), lambda: (_cache(32, 4), -torch.ones(4, 4))),
    (
        "setitem_ellipsis_key",
        lambda b, v: b.__setitem__((Ellipsis, 1), v),
        lambda: (_cache(8, 4, 3), -torch.ones(8, 4)),
    ),
    ("setitem_bool_mask", lambda b, m: b.__setitem__(m, 0.0), lambda: (_cache(32, 4), _cache(32, 4) % 3 == 0)),
    ("setitem_scalar_value", lambda b, i: b.__setitem__(i, 7.0), lambda: (_cache(32, 4), torch.tensor([0, 31]))),
    (
        "view_chain_layer_then_loc",
        lambda c, i, v: c[1].__setitem__(i, v),
        lambda: (_cache(3, 16, 4), torch.tensor([2]), -torch.ones(1, 4)),
    ),
    (
        "tuple_key_layer_loc",
        lambda c, i, v: c.__setitem__((1, i), v),
        lambda: (_cache(3, 16, 4), torch.tensor([2, 9]), -torch.ones(2, 4)),
    ),
    (
        "gpt_fast_slices_then_pos",
        lambda c, p, v: c.__setitem__((slice(None), slice(None), p), v),
        lambda: (_cache(1, 2, 16, 4), torch.tensor([5]), -torch.ones(1, 2, 1, 4)),
    ),
    (
        "view_chain_transpose",
        lambda c, i, v: c.transpose(0, 1).__setitem__(i, v),
        lambda: (_cache(4, 16), torch.tensor([3]), -torch.ones(1, 4)),
    ),
    (
        "index_copy_hf_static_cache",
        lambda c, p, v: c.index_copy_(2, p, v),
        lambda: (_cache(1, 2, 16, 4), torch.tensor([6]), -torch.ones(1, 2, 1, 4)),
    ),
    (
        "index_copy_via_view",
        lambda c, p, v: c[0].index_copy_(1, p, v),
        lambda: (_cache(2, 2, 16, 4), torch.tensor([6, 1]), -torch.ones(2, 2, 4)),
    ),
    (
        "index_put_",
        lambda b, i, v: b.index_put_((i,), v),
        lambda: (_cache(32, 4), torch.tensor([3, 9]), -torch.ones(2, 4)),
    ),
    (
        "torch_index_put_accumulate",
        lambda b, i, v: torch.index_put_(b, (i,), v, accumulate=True),
        lambda: (_cache(32, 4), torch.tensor([3, 3]), torch.ones(2, 4)),
    ),
    (
        "aten_index_put_overload",
        lambda b, i, v: torch.ops.aten.index_put_.default(b, [i], v),
        lambda: (_cache(32, 4), torch.tensor([4]), -torch.ones(1, 4)),
    ),
    (
        "index_add_alpha",
        lambda b, i, v: b.index_add_(0, i, v, alpha=2),
        lambda: (_cache(32, 4), torch.tensor([1, 1, 5]), torch.ones(3, 4)),
    ),
    ("index_fill_", lambda b, i: b.index_fill_(1, i, -1.0), lambda: (_cache(32, 4), torch.tensor([0, 2]))),
    (
        "scatter_src",
        lambda b, i, v: b.scatter_(0, i, v),
        lambda: (_cache(32, 4), torch.tensor([[1, 2, 3, 4]]), -torch.ones(1, 4)),
    ),
    ("scatter_value", lambda b, i: b.scatter_(1, i, 9.0), lambda: (_cache(32, 4), torch.tensor([[1], [3]]))),
    (
        "scatter_add_",
        lambda b, i, v: b.scatter_add_(0, i, v),
        lambda: (_cache(32, 4), torch.tensor([[1, 1, 2, 2]]), torch.ones(1, 4)),
    ),
    (
        "scatter_reduce_",
        lambda b, i, v: b.scatter_reduce_(0, i, v, "amax"),
        lambda: (_cache(32, 4), torch.tensor([[1, 1, 2, 2]]), 1000 * torch.ones(1, 4)),
    ),
    ("masked_fill_", lambda b, m: b.masked_fill_(m, -3.0), lambda: (_cache(32, 4), _cache(32, 4) % 5 == 1)),
    (
        "bf16_setitem",
        lambda b, i, v: b.__setitem__(i, v),
        lambda: (_cache(32, 8, dtype=torch.bfloat16), torch.tensor([1]), -torch.ones(1, 8, dtype=torch.bfloat16)),
    ),
    (
        "int64_index_copy",
        lambda b, i, v: b.index_copy_(0, i, v),
        lambda: (_cache(32, 4, dtype=torch.int64), torch.tensor([2]), -torch.ones(1, 4, dtype=torch.int64)),
    ),
]


ROUTED_UNDER_INDUCTOR = {
    "setitem_tensor_key",
    "setitem_int_key",
    "setitem_slice_key",
    "setitem_ellipsis_key",
    "setitem_bool_mask",
    "setitem_scalar_value",
    "gpt_fast_slices_then_pos",
    "index_copy_hf_static_cache",
    "index_put_",
    "torch_index_put_accumulate",
    "aten_index_put_overload",
    "index_add_alpha",
    "bf16_setitem",
    "int64_index_copy",
}


@pytest.mark.parametrize("option", ["inplace", "inductor"])
@pytest.mark.parametrize("form, fn, make_args", [pytest.param(i, f, m, id=i) for i, f, m in WRITE_FORMS])
def test_write_forms_match_eager_without_full_copies(form, fn, make_args, option):
    eager_args, args = make_args(), make_args()
    fn(*eager_args)
    compiled, backend = _thunderfx(fn, inplace_indexed_writes=option)
    compiled(*args)
    _assert_same(eager_args, args)
    assert _full_copies(backend) == []
    routed = option == "inductor" and form in ROUTED_UNDER_INDUCTOR
    assert ("INPLACE_INDEXED_WRITE" in _split_reasons(backend)) == routed, _split_reasons(backend)


_ROWS = 1 << 19  # [_ROWS, 32] float32: 64 MiB
_LOC = torch.tensor([7, 70_000])
_BIG_FORMS = {
    "setitem": lambda b: b.__setitem__(_LOC, torch.ones(2, 32)),
    "index_copy_": lambda b: b.index_copy_(0, _LOC, torch.ones(2, 32)),
    "index_put_": lambda b: b.index_put_((_LOC,), torch.ones(2, 32), accumulate=True),
    "index_add_": lambda b: b.index_add_(0, _LOC, torch.ones(2, 32)),
    "setitem_slice": lambda b: b.__setitem__(slice(5, 9), 1.0),
    "setitem_bool_mask": lambda b: b.__setitem__(b[:, 0] > 1e9, 2.0),
    "setitem_tuple_key": lambda b: b.__setitem__((_LOC, slice(0, 4)), torch.ones(2, 4)),
    # Inductor copies the view a partial slice makes before the tensor index (31.8 MiB here).
    "setitem_tensor_then_partial_slice": lambda b: b.__setitem__((_LOC, slice(0, 16)), torch.ones(2, 16)),
    "setitem_partial_slice_then_tensor": lambda b: b.__setitem__(
        (slice(0, _ROWS // 2), torch.tensor([1, 2])), torch.ones(_ROWS // 2, 2)
    ),
    "setitem_full_slice_then_tensor": lambda b: b.__setitem__((slice(None), torch.tensor([1, 2])), 3.0),
    "setitem_through_view": lambda b: b.view(2, _ROWS // 2, 32)[1].__setitem__(_LOC, torch.ones(2, 32)),
    "scatter_": lambda b: b.scatter_(0, _LOC[:, None].expand(2, 32), torch.ones(2, 32)),
    "scatter_reduce_": lambda b: b.scatter_reduce_(0, _LOC[:, None].expand(2, 32), torch.ones(2, 32), "amax"),
    "masked_fill_": lambda b: b.masked_fill_(b[:, :1] > 1e9, 2.0),
}


@pytest.mark.parametrize("option", ["inplace", "inductor"])
@pytest.mark.parametrize("form", sorted(_BIG_FORMS))
def test_peak_memory_of_one_call_is_far_below_the_buffer(form, option):
    # Inductor copies the whole destination for scatter_/masked_fill_, and the viewed slice for a write
    # through a view or a key that mixes a tensor with an int, a partial slice or None: those are not
    # routed, so no option lets such a copy in. The bound is a sixteenth of the buffer (4 MiB), below the
    # smallest such copy measured here (a quarter of the columns: 8 MiB).
    write = _BIG_FORMS[form]

    def fn(b):
        write(b)

    compiled, backend = _thunderfx(fn, inplace_indexed_writes=option)
    compiled(torch.zeros(_ROWS, 32))  # compile outside the measured call
    buf = torch.zeros(_ROWS, 32)
    growth = peak_memory_growth(compiled, buf)
    assert growth < buf.nbytes // 16, f"one call grew peak memory by {growth / 2**20:.1f} MiB (buffer 64 MiB)"
    expected = torch.zeros(_ROWS, 32)
    write(expected)
    assert torch.equal(buf, expected)


class TestSplits(TestCase):
    def test_default_is_one_thunder_segment_with_one_inplace_write(self):
        def write(k_buffer, loc, k):
            k_buffer[loc] = k

        buf, loc, k = (
            torch.zeros(4096, 8, 64, dtype=torch.bfloat16),
            torch.tensor([1234]),
            torch.ones(1, 8, 64, dtype=torch.bfloat16),
        )
        expected = buf.clone()
        expected[loc] = k
        compiled, backend = _thunderfx(write)
        compiled(buf, loc, k)
        assert torch.equal(buf, expected)
        assert _split_reasons(backend) == []
        (trace,) = _thunder_traces(backend)
        body = [
            ln.strip()
            for ln in str(trace).splitlines()
            if ln.startswith("  ") and ".py:" not in ln and "<eval_with_key>" not in ln
        ]
        self.assertExpectedInline(
            "\n".join(body),
            """\
# l_k_buffer_: "cpu bf16[4096, 8, 64]"
# l_loc_: "cpu i64[1]"
# l_k_: "cpu bf16[1, 8, 64]"
(t4,) = update_aliases((l_k_buffer_,))
del l_k_buffer_
t5 = setitem_(t4, l_loc_, l_k_)  # t5: "cpu bf16[4096, 8, 64]"
del t4
return ()""",
        )

    def test_inductor_option_routes_the_write_alone(self):
        def step(buf, loc, k, x):
            y = x.sin()
            buf[loc] = k
            return y + buf[loc]

        args = (torch.zeros(64, 4), torch.tensor([3]), torch.ones(1, 4), torch.rand(1, 4))
        eager_args = [a.clone() for a in args]
        expected = step(*eager_args)
        compiled, backend = _thunderfx(step, inplace_indexed_writes="inductor")
        _assert_same(expected, compiled(*args))
        _assert_same(eager_args, args)
        segments = [
            n.target
            for info in backend.subgraph_infos
            for n in info.split_graph_module.graph.nodes
            if n.op == "call_module"
        ]
        self.assertExpectedInline(str(segments), """['thunder_0', 'inductor_1', 'thunder_2']""")


def test_unknown_option_is_rejected_when_the_backend_is_made():
    with pytest.raises(ValueError, match="inplace_indexed_writes"):
        ThunderCompiler(inplace_indexed_writes="bogus")


def _add_one_then_masked_fill_then_write(buf, loc, k):
    x = buf.add_(1)
    x.masked_fill_(x > 5, 0.0)
    x[loc] = k
    return x.sum()


def _add_one_then_write(buf, loc, k):
    x = buf.add_(1)
    x[loc] = k
    return x.sum()


@pytest.mark.parametrize("option", ["inplace", "inductor"])
@pytest.mark.parametrize("fn", [_add_one_then_masked_fill_then_write, _add_one_then_write])
def test_write_through_the_result_of_an_inplace_op_runs_that_op_once(fn, option):
    # An earlier routing moved a "view chain" holding buf.add_(1) next to the write, so the add ran twice
    # (33.0 instead of 24.0, no error).
    make_args = lambda: (torch.ones(4, 3), torch.tensor([1]), torch.zeros(1, 3))
    eager_args, args = make_args(), make_args()
    expected = fn(*eager_args)
    compiled, _ = _thunderfx(fn, inplace_indexed_writes=option)
    result = compiled(*args)
    assert torch.equal(result, expected), f"{float(result)} != eager's {float(expected)}"
    _assert_same(eager_args, args)


class _KVCacheModule(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("k_cache", torch.zeros(1, 2, 64, 4))

    def forward(self, pos, k):
        self.k_cache.index_copy_(2, pos, k)
        return self.k_cache.sum(2)


@pytest.mark.parametrize("option", ["inplace", "inductor"])
def test_module_buffer_written_in_place(option):
    module, eager = _KVCacheModule(), _KVCacheModule()
    pos, k = torch.tensor([5]), torch.randn(1, 2, 1, 4)
    expected = eager(pos, k)
    compiled, backend = _thunderfx(module, inplace_indexed_writes=option)
    _assert_same(expected, compiled(pos, k))
    assert torch.equal(module.k_cache, eager.k_cache)
    assert _full_copies(backend) == []


def _write_through_view_where_a_gradient_flows(x, v):
    t = x * 2 + v.repeat(2, 1)
    t[1:][torch.tensor([2, 0])] = v
    return t


# Writes where a gradient flows into a storage with views: x (4, 3) and w (3,) require grad, buf does not.
def _views_read_before_the_write(x, w, buf):
    y = x * 1
    s = y.view(-1).sum()
    y[0] = w
    return s + (y * y).sum()


def _view_made_after_the_write(x, w, buf):
    y = x * 1
    y[0] = w
    v = y.view(-1)
    return (v * v).sum()


def _view_read_after_the_write(x, w, buf):
    y = x * 1
    v = y.view(-1)
    y[0] = w
    return (v * v).sum()


def _view_through_reshape_read_after_the_write(x, w, buf):
    y = x * 1
    v = y.reshape(-1)
    y[0] = w
    return (v * v).sum()


def _base_read_after_a_write_through_a_slice(x, w, buf):
    y = x * 1
    y[1:][0] = w
    return (y * y).sum()


def _input_read_after_masked_scatter_into_its_view(x, w, buf):
    buf[1:].masked_scatter_(buf[1:] > 0, w.repeat(3))
    return (buf * x).sum()


def _aliased_inputs_read_after_the_write(y, v, w):
    y[1] = w
    return (v * 2).sum()


def _input_requiring_grad_written(y, w):
    y[1] = w
    return (y * y).sum()


def _view_inputs():
    torch.manual_seed(0)
    x = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    w = torch.randn(3, dtype=torch.float64, requires_grad=True)
    return x, w, torch.randn(4, 3, dtype=torch.float64)


# How each program is called: a graph input may be made outside the compiled function from x.
_CALLS = {
    _aliased_inputs_read_after_the_write: lambda f, x, w, buf: (lambda y: f(y, y[1:], w))(x * 1),
    _input_requiring_grad_written: lambda f, x, w, buf: f(x * 1, w),
}


def _check_value_and_gradients_like_eager(fn):
    call = _CALLS.get(fn, lambda f, x, w, buf: f(x, w, buf))
    x, w, buf = _view_inputs()
    expected = call(fn, x, w, buf)
    expected_grads = torch.autograd.grad(expected, (x, w), torch.ones_like(expected))
    compiled, backend = _thunderfx(fn)
    cx, cw, cbuf = _view_inputs()
    actual = _outcome(lambda: call(compiled, cx, cw, cbuf))
    assert not isinstance(actual, Exception), f"eager runs it; ThunderFX raised {actual!r}"
    assert torch.equal(actual, expected) and torch.equal(cbuf, buf)
    # allow_unused: a dropped gradient shows as a None mismatch, not as an autograd error
    actual_grads = torch.autograd.grad(actual, (cx, cw), torch.ones_like(actual), allow_unused=True)
    torch.testing.assert_close(actual_grads, expected_grads)
    return backend


def _outcome(call):
    """``call()``'s value, or the exception it raised (asserted against eager's outcome by the caller)."""
    try:
        return call()
    except Exception as e:
        return e


@pytest.mark.parametrize(
    "fn", [_views_read_before_the_write, _view_made_after_the_write], ids=lambda fn: fn.__name__.strip("_")
)
def test_write_with_no_view_read_after_it_stays_in_thunder_where_a_gradient_flows(fn):
    # Kept behaviour: stock ThunderFX gives eager's value and gradients. The written tensor's views are read only
    #   before the write, so nothing leaves Thunder.
    backend = _check_value_and_gradients_like_eager(fn)
    assert _split_reasons(backend) == []
    assert len(_thunder_traces(backend)) == 1


@pytest.mark.parametrize(
    "fn",
    [
        _view_read_after_the_write,
        _view_through_reshape_read_after_the_write,
        _base_read_after_a_write_through_a_slice,
        _input_read_after_masked_scatter_into_its_view,
        _aliased_inputs_read_after_the_write,
        _input_requiring_grad_written,
    ],
    ids=lambda fn: fn.__name__.strip("_"),
)
def test_write_with_an_alias_read_after_it_runs_as_eager_where_a_gradient_flows(fn):
    # Stock ThunderFX gave these wrong gradients, silently (or failed: aliased inputs); kept in Thunder they
    #   raised NotImplementedError, or for the written input requiring grad, lost its gradient.
    #   Thunder's segment would see the write without the view relation (a view passed in, or a reshape that
    #   may copy), and its autograd.Function does not tell PyTorch that it writes an input.
    backend = _check_value_and_gradients_like_eager(fn)
    assert "ALIASED_WRITE_UNDER_GRAD" in _split_reasons(backend)


def _view_through_reshape_read_after_copy_into_a_row(x, w, buf):
    y = x * 1
    v = y.reshape(-1)
    y[1].copy_(w)
    return (v * v).sum()


def _aliased_inputs_read_after_copy_into_one(y, v, w):
    y[1].copy_(w)
    return (v * 2).sum()


_CALLS[_aliased_inputs_read_after_copy_into_one] = _CALLS[_aliased_inputs_read_after_the_write]


@pytest.mark.parametrize(
    "fn",
    [_view_through_reshape_read_after_copy_into_a_row, _aliased_inputs_read_after_copy_into_one],
    ids=lambda fn: fn.__name__.strip("_"),
)
def test_copy_with_an_alias_read_after_it_runs_as_eager_where_a_gradient_flows(fn):
    # Tensor.copy_ is a write like ``y[1] = w``: where thunder.jit cannot make the alias again (a reshape that may
    #   copy, an argument sharing storage), the nodes run as eager. Stock gave a wrong gradient, silently (the
    #   reshape) or a RuntimeError (the aliased arguments); without the splitter's part, stock's wrong gradients.
    backend = _check_value_and_gradients_like_eager(fn)
    assert "ALIASED_WRITE_UNDER_GRAD" in _split_reasons(backend)


def _index_copy_out_of_range_into_an_input_requiring_grad(buf, index, source):
    buf.index_copy_(0, index, source)


def _index_copy_negative_index_into_a_view_requiring_grad(buf, index, source):
    buf.narrow(1, 0, 3).index_copy_(1, index, source)


@pytest.mark.parametrize(
    "fn, index, source_shape",
    [
        (_index_copy_out_of_range_into_an_input_requiring_grad, [-9, 2, 3], (3, 5)),
        (_index_copy_negative_index_into_a_view_requiring_grad, [-1, 0], (7, 2)),
    ],
    ids=["out_of_range", "negative_into_a_view"],
)
def test_bad_index_where_a_gradient_flows_raises_like_eager(fn, index, source_shape):
    # These writes leave the Thunder segment where a gradient flows; compiled by Inductor, index_copy_ raised
    #   its kernel's bounds error (out_of_range) or wrote at index -1 without an error (negative_into_a_view),
    #   where eager (and stock) raise IndexError. Their segment runs as eager PyTorch (fuzz seeds 100127, 100143).
    def inputs():
        leaf = torch.randn(7, 5, generator=torch.Generator().manual_seed(0)).requires_grad_()
        source = torch.randn(source_shape, generator=torch.Generator().manual_seed(1)).requires_grad_()
        return leaf.clone(), torch.tensor(index), source

    expected_args, actual_args = inputs(), inputs()
    expected = _outcome(lambda: fn(*expected_args))
    assert isinstance(expected, IndexError)
    compiled, backend = _thunderfx(fn)
    actual = _outcome(lambda: compiled(*actual_args))
    assert type(actual) is type(expected), repr(actual)
    assert torch.equal(actual_args[0], expected_args[0])
    assert "ALIASED_WRITE_UNDER_GRAD" in _split_reasons(backend)


def _read_before_a_masked_write_into_a_view_requiring_grad(base, mask, values):
    buf = base.transpose(0, 1)
    before = buf[1].clone()
    buf[mask] = values
    return (before,)


def test_segment_that_runs_eagerly_returns_what_eager_returns():
    # Inductor's segment returned the output tuple's tensor inside a list (fuzz seed 100047).
    def inputs():
        g = torch.Generator().manual_seed(0)
        leaf = torch.randint(-4, 5, (5, 2, 4), generator=g).float().requires_grad_()
        mask = torch.rand(2, 5, 4, generator=g) < 0.5
        values = torch.randn(int(mask.sum()), generator=g).requires_grad_()
        return leaf, (leaf.clone(), mask, values)

    expected_leaf, expected_args = inputs()
    actual_leaf, actual_args = inputs()
    expected = _read_before_a_masked_write_into_a_view_requiring_grad(*expected_args)
    compiled, backend = _thunderfx(_read_before_a_masked_write_into_a_view_requiring_grad)
    actual = compiled(*actual_args)
    assert type(actual) is tuple and len(actual) == 1, type(actual)
    assert torch.equal(actual[0], expected[0]) and torch.equal(actual_args[0], expected_args[0])
    (expected_grad,) = torch.autograd.grad(expected[0].sum(), expected_leaf)
    (actual_grad,) = torch.autograd.grad(actual[0].sum(), actual_leaf)
    assert torch.equal(actual_grad, expected_grad)


def _write_then_no_grad_write(buf, index, values):
    buf[index] = values
    with torch.no_grad():
        buf.mul_(2)
    return buf.sum()


def test_no_grad_region_cut_by_an_eager_segment_leaves_grad_mode_as_eager_does():
    # The eager segment of the write ends inside the no_grad region, so the Thunder segment after it starts with
    #   the region's exit: on its cache hits grad mode stayed disabled for the caller (fuzz seed 500395).
    def inputs():
        leaf, values = torch.arange(6.0, requires_grad=True), torch.tensor([5.0, 7.0], requires_grad=True)
        return (leaf, values), (leaf * 1, torch.tensor([1, 4]), values)

    expected_leaves, expected_args = inputs()
    expected = _write_then_no_grad_write(*expected_args)
    expected_grads = torch.autograd.grad(expected, expected_leaves)
    compiled, backend = _thunderfx(_write_then_no_grad_write)
    for call in range(3):
        actual_leaves, actual_args = inputs()
        actual = compiled(*actual_args)
        assert torch.is_grad_enabled(), f"call {call} left grad mode disabled"
        assert actual.requires_grad, f"call {call}"
        assert torch.equal(actual, expected) and torch.equal(actual_args[0], expected_args[0])
        for actual_grad, expected_grad in zip(torch.autograd.grad(actual, actual_leaves), expected_grads):
            assert torch.equal(actual_grad, expected_grad), f"call {call}"
    assert "ALIASED_WRITE_UNDER_GRAD" in _split_reasons(backend)


def test_write_into_a_view_where_a_gradient_flows_runs_as_eager():
    x, v = torch.randn(4, 3, requires_grad=True), torch.randn(2, 3, requires_grad=True)
    expected = _write_through_view_where_a_gradient_flows(x, v)
    compiled, backend = _thunderfx(_write_through_view_where_a_gradient_flows)
    actual = _outcome(lambda: compiled(x, v))
    assert not isinstance(actual, Exception), f"eager runs it; ThunderFX raised {actual!r}"
    assert torch.equal(actual, expected)
    cotangent = torch.randn(4, 3)
    torch.testing.assert_close(
        torch.autograd.grad(actual, (x, v), cotangent), torch.autograd.grad(expected, (x, v), cotangent)
    )
    assert "ALIASED_WRITE_UNDER_GRAD" in _split_reasons(backend)
    # Without grad the write stays in Thunder, in place.
    with torch.no_grad():
        compiled, backend = _thunderfx(_write_through_view_where_a_gradient_flows)
        _assert_same(_write_through_view_where_a_gradient_flows(x, v), compiled(x, v))
    assert _split_reasons(backend) == []


def _write_into_an_input_that_another_input_aliases(buf, alias, index, source):
    buf.index_add_(2, index, source, alpha=-1)
    return alias * 2


def test_write_into_an_aliased_input_stays_in_thunder_under_the_inductor_option():
    # Found by the differential fuzzer: Inductor's segment failed on it ("tensor does not have a device").
    def make_args():
        generator = torch.Generator().manual_seed(0)
        buf = torch.randn(8, 4, 4, generator=generator)
        return buf, buf[:, 2], torch.tensor([1, 0, 2, 0, 2, 2]), torch.randn(8, 4, 6, generator=generator)

    eager_args, args = make_args(), make_args()
    expected = _write_into_an_input_that_another_input_aliases(*eager_args)
    compiled, backend = _thunderfx(_write_into_an_input_that_another_input_aliases, inplace_indexed_writes="inductor")
    torch.testing.assert_close(compiled(*args), expected)
    torch.testing.assert_close(args[0], eager_args[0])
    assert _split_reasons(backend) == []


def _views_taken_before_a_write(buf, values):
    row = buf[6]
    head = buf.narrow(0, 0, 6)
    buf[:, 6:7] = values
    tail = row.narrow(0, 4, 1)
    return head, tail * 2


@pytest.mark.parametrize("contiguous", [True, False], ids=["contiguous", "transposed"])
def test_write_into_an_input_viewed_before_the_write_stays_in_thunder_under_the_inductor_option(contiguous):
    # Found by the differential fuzzer (seed 1053): given the input and the earlier view `row` as two
    # arguments, Inductor's segment failed in AOT's ViewMeta replay ("incorrect out shape"), or returned
    # `head` with the wrong strides.
    def make_args():
        buf = _cache(7, 7) if contiguous else _cache(7, 7).t()
        return buf, -torch.ones(7, 1)

    eager_args, args = make_args(), make_args()
    expected = _views_taken_before_a_write(*eager_args)
    compiled, backend = _thunderfx(_views_taken_before_a_write, inplace_indexed_writes="inductor")
    actual = compiled(*args)
    _assert_same(expected, actual)
    _assert_same(eager_args, args)
    assert "INPLACE_INDEXED_WRITE" not in _split_reasons(backend)


def _write_scaled_by_an_int(buf, n, loc, k):
    buf[loc] = k * n
    return buf.sum()


def test_graph_with_a_symint_input_routes_under_the_inductor_option():
    # From the second call Dynamo passes `n` as a SymInt input, which has no storage: the alias check
    # compared it with the tensors' storages and raised (HF gpt-oss's sliding-window counter).
    compiled, backend = _thunderfx(_write_scaled_by_an_int, inplace_indexed_writes="inductor")
    eager_buf, buf = _cache(16, 4), _cache(16, 4)
    for n in (2, 3, 4):
        loc, k = torch.tensor([n]), -torch.ones(1, 4)
        _assert_same(_write_scaled_by_an_int(eager_buf, n, loc, k), compiled(buf, n, loc, k))
        _assert_same(eager_buf, buf)
    assert "INPLACE_INDEXED_WRITE" in _split_reasons(backend)


def _index_copy_then_clamp(buf, index, source):
    buf.index_copy_(0, index, source)
    buf.clamp_(min=-1.0, max=1.0)


@pytest.mark.parametrize(
    "index, source_rows", [([1, 4], 1), ([0, 1, 2, 3, 4, 5, 7], 6)], ids=["returned_normally", "inductor_asserted"]
)
def test_write_whose_arguments_fail_thunders_checks_raises_like_eager(index, source_rows):
    # A source shorter than its index: Thunder's functional index_copy checks it as eager does, so the splitter's
    #   support check failed and the write went to Inductor, which returned without an error or raised its own
    #   AssertionError ("Broadcast failed in ExpandView") where eager raises IndexError (fuzz seeds 100203, 100315
    #   under inplace_indexed_writes="functional"; stock's default, the functional lowering, the same). The write
    #   runs as eager PyTorch now.
    def inputs():
        g = torch.Generator().manual_seed(0)
        return torch.randn(8, 3, generator=g), torch.tensor(index), torch.randn(source_rows, 3, generator=g)

    expected_args, actual_args = inputs(), inputs()
    expected = _outcome(lambda: _index_copy_then_clamp(*expected_args))
    assert isinstance(expected, IndexError)
    torch._dynamo.reset()
    if isinstance(_outcome(lambda: torch.compile(_index_copy_then_clamp, backend="eager")(*inputs())), RuntimeError):
        pytest.skip("from torch 2.13 Dynamo rejects the call while it makes the graph: no backend sees it")
    compiled, backend = _thunderfx(_index_copy_then_clamp, inplace_indexed_writes="functional")
    actual = _outcome(lambda: compiled(*actual_args))
    assert type(actual) is type(expected), repr(actual)
    assert torch.equal(actual_args[0], expected_args[0])
