"""Gradients through in-place indexed writes into a storage that has views.

Where a gradient may flow, thunder.torch keeps the functional lowering of an in-place indexed write
(``t = setitem(y, idx, w); y2 = copy_(t, y)``) and update_aliases makes later reads of ``y`` read ``y2``.
A view of the storage taken before the write and read after it (and a base read after a write through its
view) must read the written values, and its gradient must reach them:
:func:`thunder.torch.indexed_writes.rebase_views_after_differentiable_writes` makes those views again from
the written tensor. Each case is compared with eager PyTorch: the value, the caller's buffers and the
gradients; what cannot be made again raises (eager's error, or ``NotImplementedError``).
"""

import pytest
import torch

import thunder
from thunder.tests.test_inplace_indexed_writes import _differentiable_base, _grad_inputs, _outcome, tensor_


def _write_through_view(x, v):
    t = _differentiable_base(x, v)
    t[1:][tensor_([2, 0])] = v
    return t


def _write_then_read_view(x, v):
    t = _differentiable_base(x, v)
    tail = t[1:]
    t.index_copy_(0, tensor_([3]), v[:1])
    return tail * 2


# Writes where a gradient flows into a storage that has views. Each program takes x (4, 3) and w (3,),
#   which require grad, and buf (4, 3), which does not: an input buffer written with w.
def _views_read_before_the_write(x, w, buf):
    y = x * 1
    s = y.view(-1).sum()
    y[0] = w
    return s + (y * y).sum()


def _row_read_before_index_copy(x, w, buf):
    y = x * 1
    s = y[0].sum()
    y.index_copy_(0, tensor_([0]), w[None])
    return s + (y * y).sum()


def _view_of_a_view_read_before_the_write(x, w, buf):
    y = x * 1
    s = y[1:][0].sum()
    y[1] = w
    return s + (y * y).sum()


def _transposed_view_read_before_index_put(x, w, buf):
    y = x * 1
    s = y.t().exp().sum()
    y.index_put_((tensor_([2]),), w)
    return s * y.sum()


def _input_viewed_before_the_write(x, w, buf):
    s = buf.view(-1).sum()
    buf[0] = w
    return s + (buf * x).sum()


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


def _view_of_the_written_view_read_beside_a_sibling(x, w, buf):
    y = x * 1
    a, c = y[:1], y[1:]
    u = a.view(-1)
    a[0] = w
    return (c * c).sum() + (u * u).sum()


def _view_read_before_and_after_the_write(x, w, buf):
    y = x * 1
    v = y[1:]
    s = v.sum()
    y[1] = w
    return s + (v * 2).sum()


def _view_of_a_view_read_after_the_write(x, w, buf):
    y = x * 1
    u = y[1:].t()
    y[1] = w
    return (u * u).sum()


def _view_not_overlapping_the_write(x, w, buf):
    y = x * 1
    v = y[1:]
    y[0] = w
    return (v * v).sum() + (y * y).sum()


def _view_returned_after_the_write(x, w, buf):
    y = x * 1
    v = y[:2]
    y[1] = w
    return v


def _input_view_read_after_the_write(x, w, buf):
    v = buf[1:]
    buf[1] = w
    return (v * x[1:]).sum()


def _column_view_read_after_index_put(x, w, buf):
    y = x * 1
    v = y[:, 1:]
    y.index_put_((tensor_([0, 2]),), w)
    return (v * v).sum()


def _base_read_after_a_write_through_a_slice(x, w, buf):
    y = x * 1
    y[1:][0] = w
    return (y * y).sum()


def _base_read_after_a_write_through_a_flat_view(x, w, buf):
    y = x * 1
    y.view(-1)[:3] = w
    return (y * y).sum()


def _base_read_after_a_write_through_a_transposed_view(x, w, buf):
    y = x * 1
    y.t()[1][:3] = w
    return (y * y).sum()


def _base_read_after_index_copy_through_narrow_and_swapaxes(x, w, buf):
    y = x * 1
    y.narrow(0, 1, 2).swapaxes(0, 1).index_copy_(1, tensor_([1]), w[:, None] * 2)
    return (y * y).sum()


def _base_read_after_index_copy_into_a_view(x, w, buf):
    y = x * 1
    y[1:].index_copy_(0, tensor_([1]), w[None])
    return (y * y).sum()


def _base_and_view_read_after_a_write_through_the_view(x, w, buf):
    y = x * 1
    v = y[1:]
    v[0] = w
    return (v * v).sum() + (y * y).sum()


def _only_the_written_view_read_after(x, w, buf):
    y = x * 1
    v = y[1:]
    v[0] = w
    return (v * v).sum()


def _overlapping_view_read_after_a_write_through_another(x, w, buf):
    y = x * 1
    a, c = y[:2], y[1:]
    a[1] = w
    return (c * c).sum()


def _separate_view_read_after_a_write_through_another(x, w, buf):
    y = x * 1
    a, c = y[:1], y[1:]
    a[0] = w
    return (c * c).sum() + (a * a).sum()


def _view_made_again_then_written(x, w, buf):
    y = x * 1
    v = y[1:]
    y[1] = w
    v[0] = w * 3
    return (y * y).sum() + (v * v).sum()


def _input_read_after_a_write_through_its_view(x, w, buf):
    buf[1:][0] = w
    return (buf * x).sum()


def _input_read_after_masked_scatter_into_its_view(x, w, buf):
    buf[1:].masked_scatter_(buf[1:] > 0, w.repeat(3))
    return (buf * x).sum()


def _view_read_after_mul_(x, w, buf):
    y = x * 1
    t = y.transpose(0, 1)
    y.mul_(0.5)
    return (t * w.unsqueeze(1)).sum()


def _view_written_after_its_base_was_scaled(x, w, buf):
    y = x * 1
    t = y.transpose(0, 1)
    y.mul_(w)
    t.add_(-2.0)
    return (t * t).sum()


def _base_read_after_clamp_of_its_view(x, w, buf):
    y = x * w
    y[1:3].clamp_(min=-0.5, max=0.5)
    return (y * y).sum()


def _view_read_after_zero_(x, w, buf):
    y = x + w
    row = y[2]
    y.zero_()
    return (row + x[0]).sum()


def _view_inputs():
    torch.manual_seed(0)
    x = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    w = torch.randn(3, dtype=torch.float64, requires_grad=True)
    return x, w, torch.randn(4, 3, dtype=torch.float64)


def _check_value_and_gradients_like_eager(fn, compiled, arguments=lambda x, w, buf: (x, w, buf)):
    """``compiled(*arguments(x, w, buf))`` against eager's ``fn(x, w, buf)``: value, ``buf`` and the gradients
    of ``x`` and ``w``."""
    x, w, buf = _view_inputs()
    expected = fn(x, w, buf)
    expected_grads = torch.autograd.grad(expected, (x, w), torch.ones_like(expected))
    cx, cw, cbuf = _view_inputs()
    actual = _outcome(lambda: compiled(*arguments(cx, cw, cbuf)))
    assert not isinstance(actual, Exception), f"eager runs it; compiled raised {actual!r}"
    assert torch.equal(actual, expected) and torch.equal(cbuf, buf)
    # allow_unused: a dropped gradient shows as a None mismatch, not as an autograd error
    actual_grads = torch.autograd.grad(actual, (cx, cw), torch.ones_like(actual), allow_unused=True)
    torch.testing.assert_close(actual_grads, expected_grads)


# Stock thunder 0.2.6 gets these right: the destination has views, but none is read after the write (kept
#   behaviour; the pass must leave them alone).
KEPT_VIEW_GRAD_CASES = [
    _views_read_before_the_write,
    _row_read_before_index_copy,
    _view_of_a_view_read_before_the_write,
    _transposed_view_read_before_index_put,
    _input_viewed_before_the_write,
    _view_made_after_the_write,  # kept: thunder.jit was right before too (ThunderFX failed it)
    _view_not_overlapping_the_write,
    _only_the_written_view_read_after,
    _separate_view_read_after_a_write_through_another,
]
# Stock thunder 0.2.6 gave these a wrong gradient, silently (a view read after the write kept the gradient
#   of the elements before it; the written values got none).
FIXED_VIEW_GRAD_CASES = [
    _view_read_after_the_write,
    _view_of_the_written_view_read_beside_a_sibling,
    _view_read_before_and_after_the_write,
    _view_of_a_view_read_after_the_write,
    _view_returned_after_the_write,
    _input_view_read_after_the_write,
    _column_view_read_after_index_put,
    _base_read_after_a_write_through_a_slice,
    _base_read_after_a_write_through_a_flat_view,
    _base_read_after_a_write_through_a_transposed_view,
    _base_read_after_index_copy_through_narrow_and_swapaxes,
    _base_read_after_index_copy_into_a_view,
    _base_and_view_read_after_a_write_through_the_view,
    _overlapping_view_read_after_a_write_through_another,
    _view_made_again_then_written,
    _input_read_after_a_write_through_its_view,
    _input_read_after_masked_scatter_into_its_view,  # stock: masked_scatter_ unsupported
]


# The series gave these a wrong gradient, silently, where stock raised (the result had no history): a view read
#   after an in-place op that is not an indexed write (mul_, add_, clamp_, zero_) into its storage.
ELEMENTWISE_VIEW_GRAD_CASES = [
    _view_read_after_mul_,
    _view_written_after_its_base_was_scaled,
    _base_read_after_clamp_of_its_view,
    _view_read_after_zero_,
]


@pytest.mark.parametrize("compile", ("jit", "thunderfx"))
@pytest.mark.parametrize("fn", ELEMENTWISE_VIEW_GRAD_CASES, ids=lambda fn: fn.__name__.strip("_"))
def test_gradient_of_views_read_after_other_in_place_ops_like_eager(fn, compile):
    from thunder.dynamo import ThunderCompiler

    compiled = thunder.jit(fn) if compile == "jit" else torch.compile(fn, backend=ThunderCompiler())
    _check_value_and_gradients_like_eager(fn, compiled)


@pytest.mark.parametrize("fn", KEPT_VIEW_GRAD_CASES, ids=lambda fn: fn.__name__.strip("_"))
def test_gradient_of_write_into_storage_with_views_like_stock(fn):
    _check_value_and_gradients_like_eager(fn, thunder.jit(fn))


@pytest.mark.parametrize("fn", FIXED_VIEW_GRAD_CASES, ids=lambda fn: fn.__name__.strip("_"))
def test_gradient_of_views_read_after_a_write_like_eager(fn):
    _check_value_and_gradients_like_eager(fn, thunder.jit(fn))


@pytest.mark.parametrize("fn", [_write_through_view, _write_then_read_view], ids=["through_view", "base_with_view"])
def test_gradient_of_intermediate_views_written_like_eager(fn):
    # Stock gave the written values no gradient.
    x, v, _ = _grad_inputs()
    expected = fn(x, v)
    expected_grads = torch.autograd.grad(expected, (x, v), torch.ones_like(expected))
    out = _outcome(lambda: thunder.jit(fn)(x, v))
    assert not isinstance(out, Exception), f"eager runs it; thunder.jit raised {out!r}"
    assert torch.equal(out, expected)
    grads = torch.autograd.grad(out, (x, v), torch.ones_like(out), allow_unused=True)
    torch.testing.assert_close(grads, expected_grads)


def test_views_read_after_the_write_are_made_again_from_the_written_tensor():
    jfn = thunder.jit(_view_read_after_the_write)
    out = _outcome(lambda: jfn(*_view_inputs()))
    assert not isinstance(out, Exception), f"eager runs it; thunder.jit raised {out!r}"
    (rebased,) = [t for t in thunder.last_traces(jfn) if "Rebase views" in str(t.get_provenance())]
    # v = y.view(-1); t3 = setitem_(y, 0, w); t8 = view(t3, -1); mul(t8, t8): the read after the write reads a
    #   view made again from the write's result.
    (write,) = [b for b in rebased.bound_symbols if b.sym.name == "setitem_"]
    (view_again,) = [b for b in rebased.bound_symbols if b.sym.name == "view" and b.args[0].name == write.output.name]
    (mul,) = [b for b in rebased.bound_symbols if b.sym.name == "mul" and b.args[0].ndim == 1]
    assert [a.name for a in mul.args] == [view_again.output.name] * 2
    # Where no view is read after the write, the trace is left as it is.
    jfn = thunder.jit(_views_read_before_the_write)
    jfn(*_view_inputs())
    assert not [t for t in thunder.last_traces(jfn) if "Rebase views" in str(t.get_provenance())]


def _view_read_only_for_its_shape_after_the_write(x, w, buf):
    y = x * 1
    v = y.view(-1)
    y[0] = w
    return torch.zeros_like(v).sum() + (y * y).sum()


def test_view_read_only_for_its_shape_after_the_write_is_left_alone():
    # zeros_like reads no value of v: nothing to make again, and the trace is left as it is.
    fn = _view_read_only_for_its_shape_after_the_write
    _check_value_and_gradients_like_eager(fn, jfn := thunder.jit(fn))
    assert not [t for t in thunder.last_traces(jfn) if "Rebase views" in str(t.get_provenance())]


def _split_views_read_after_the_write(x, w, buf):
    y = x * 1
    a, c = y.split(2)
    y[0] = w
    return (a * a).sum() + c.sum()


def _unbound_rows_read_after_the_write(x, w, buf):
    y = x * 1
    rows = y.unbind(0)
    y[0] = w
    return rows[0].sum() * rows[1].sum()


def _write_into_a_split_view(x, w, buf):
    y = x * 1
    y.split(2)[1][0] = w
    return y.sum()


@pytest.mark.parametrize(
    "fn",
    [_split_views_read_after_the_write, _unbound_rows_read_after_the_write, _write_into_a_split_view],
    ids=lambda fn: fn.__name__.strip("_"),
)
def test_write_changing_views_of_split_or_unbind_raises_like_eager(fn):
    # Eager refuses a view made by a function returning several views once its storage is written where a
    #   gradient flows; stock thunder ran it.
    with pytest.raises(RuntimeError, match="returns multiple views"):
        torch.autograd.grad(fn(*_view_inputs()), _view_inputs()[:2], allow_unused=True)
    with pytest.raises(RuntimeError, match="returns multiple views"):
        thunder.jit(fn)(*_view_inputs())


def _view_through_reshape_read_after_the_write(x, w, buf):
    y = x * 1
    v = y.reshape(-1)
    y[0] = w
    return (v * v).sum()


def _aliased_inputs_read_after_the_write(y, v, w):
    y[1] = w
    return (v * 2).sum()


def test_views_that_cannot_be_made_again_raise_where_a_gradient_flows():
    # Stock thunder gave the first a wrong gradient, silently (reshape of a contiguous tensor is a view); the
    #   trace cannot tell a reshape that views from one that copies. The view relation of two arguments
    #   (the second) is not in the trace either.
    x, w, buf = _view_inputs()
    with pytest.raises(NotImplementedError, match="gradient would be wrong"):
        thunder.jit(_view_through_reshape_read_after_the_write)(x, w, buf)
    y = x * 1
    with pytest.raises(NotImplementedError, match="gradient would be wrong"):
        thunder.jit(_aliased_inputs_read_after_the_write)(y, y[1:], w)
    # Without grad they run, like eager.
    with torch.no_grad():
        expected = _view_through_reshape_read_after_the_write(x, w, buf)
        assert torch.equal(thunder.jit(_view_through_reshape_read_after_the_write)(x, w, buf), expected)
        y, ey = x * 1, x * 1
        expected = _aliased_inputs_read_after_the_write(ey, ey[1:], w)
        assert torch.equal(thunder.jit(_aliased_inputs_read_after_the_write)(y, y[1:], w), expected)
        assert torch.equal(y, ey)


def _write_into_aliased_arguments_after_index_copy(y, v, w, index):
    z = y.clone()
    z.index_copy_(0, index, w[None])  # eager: IndexError for index -1
    y[1] = w
    return (v * 2).sum() + z.sum()


def _write_changing_split_views_after_index_copy(y, v, w, index):
    a, c = y.split(2)
    z = y.clone()
    z.index_copy_(0, index, w[None])
    y[0] = w
    return (a * a).sum() + c.sum() + z.sum()


def _index_copy_into_aliased_arguments(y, v, w, index):
    y.index_copy_(0, index, w[None])
    return (v * 2).sum()


def _write_into_aliased_arguments_returning_nothing(y, v, w, index):
    z = y.clone()
    z.index_copy_(0, index, w[None])
    y[1] = w
    v.mul_(2)


@pytest.mark.parametrize("index", [-1, 3], ids=["bad_index", "good_index"])
@pytest.mark.parametrize(
    "fn",
    [
        _write_into_aliased_arguments_after_index_copy,
        _write_changing_split_views_after_index_copy,
        _index_copy_into_aliased_arguments,
        _write_into_aliased_arguments_returning_nothing,
    ],
    ids=lambda fn: fn.__name__.strip("_"),
)
def test_write_that_cannot_be_made_right_raises_where_the_program_reaches_it(fn, index):
    # A write the pass cannot make right (arguments that share storage, one read after a write into the other;
    #   split views read after a write) raises when the computation gets there, as eager raises only at the
    #   statement that fails: a bad index before it, or in it, is the program's error (eager's; stock thunder's
    #   too, as it runs the write), and the argument is left as it was. Raised while tracing, the pass's own
    #   error replaced the index error.
    x, w, _ = _view_inputs()
    eager_y, y = x * 1, x * 1
    before = y.detach().clone()

    def eager():
        out = fn(eager_y, eager_y[1:], w, tensor_([index]))
        if out is not None:
            torch.autograd.grad(out, (x, w))

    expected = _outcome(eager)
    if not isinstance(expected, Exception):
        expected = NotImplementedError("eager runs it; thunder.jit cannot give its gradient")
    actual = _outcome(lambda: thunder.jit(fn)(y, y[1:], w, tensor_([index])))
    assert type(actual) is type(expected), f"eager: {expected!r}; thunder.jit: {actual!r}"
    assert torch.equal(y.detach(), before)


def _aliased_inputs_read_before_the_write(x, w, buf):
    y = x * 1
    return _aliased_arguments_read_before_the_write(y, y[1:], w)


def _aliased_arguments_read_before_the_write(y, v, w):
    s = v.sum()
    y[1] = w
    return s + (y * y).sum()


def _argument_requiring_grad_with_a_view_read_after_the_write(y, w):
    v = y[1:]
    y[1] = w
    return (v * v).sum()


def _argument_requiring_grad_read_after_a_write_through_its_view(y, w):
    v = y[1:]
    v[0] = w
    return (v * v).sum() + (y * 3).sum()


@pytest.mark.parametrize(
    "fn",
    [
        _argument_requiring_grad_with_a_view_read_after_the_write,
        _argument_requiring_grad_read_after_a_write_through_its_view,
    ],
    ids=lambda fn: fn.__name__.strip("_"),
)
def test_write_into_an_argument_requiring_grad_with_views_like_eager(fn):
    # The argument's gradient is that of the tensor passed in, and the view is made again from the written
    #   one. Stock thunder raised AssertionError for the first and eager's leaf error for the second (it wrote
    #   into the caller's leaf).
    def through_a_non_leaf(x, w, buf):
        return fn(x * 1, w)

    _check_value_and_gradients_like_eager(through_a_non_leaf, thunder.jit(fn), lambda x, w, buf: (x * 1, w))


def _aliased_arguments_shape_read_after_the_write(y, v, w):
    y[1] = w
    return (torch.zeros_like(v) + y[1:]).sum()


def _aliased_inputs_shape_read_after_the_write(x, w, buf):
    y = x * 1
    return _aliased_arguments_shape_read_after_the_write(y, y[1:], w)


def test_write_into_an_argument_aliased_by_another_whose_shape_is_read_after_like_eager():
    # zeros_like reads only the shape of the other argument: no value, so nothing to make again. Counted as
    #   a read it would raise NotImplementedError (arguments that share storage, one read after a write into the other).
    _check_value_and_gradients_like_eager(
        _aliased_inputs_shape_read_after_the_write,
        thunder.jit(_aliased_arguments_shape_read_after_the_write),
        lambda x, w, buf: ((y := x * 1), y[1:], w),
    )


def test_write_into_an_argument_requiring_grad_aliased_by_another_read_before_like_eager():
    # Two arguments that share storage, the view read only before the write: eager's value and gradients.
    #   Stock thunder raised RuntimeError (a reshape of the wrong size).
    _check_value_and_gradients_like_eager(
        _aliased_inputs_read_before_the_write,
        thunder.jit(_aliased_arguments_read_before_the_write),
        lambda x, w, buf: ((y := x * 1), y[1:], w),
    )


def _leaf_read_after_a_write_through_its_view(x, w):
    x[1:][0] = w
    return (x * x).sum()


def _nothing_read_after_a_write_through_a_view_of_a_leaf(x, w):
    x[1:][0] = w
    return (w * 2).sum()


def _view_of_a_leaf_read_after_index_copy_into_it(x, w):
    return x[1:].index_copy_(0, tensor_([0]), w[None]).sum()


@pytest.mark.parametrize(
    "fn",
    [
        _leaf_read_after_a_write_through_its_view,
        _nothing_read_after_a_write_through_a_view_of_a_leaf,
        _view_of_a_leaf_read_after_index_copy_into_it,
    ],
    ids=lambda fn: fn.__name__.strip("_"),
)
def test_write_through_a_view_of_a_leaf_requiring_grad_raises_like_eager(fn):
    x, w = torch.randn(4, 3, requires_grad=True), torch.randn(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        fn(x, w)
    before = x.detach().clone()
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        thunder.jit(fn)(x, w)
    assert torch.equal(x.detach(), before)


# Tensor.copy_ into a view is the write ``view[...] = source``; into a tensor whose views are read after it, a
#   write of every element. Stock and the series before gave those reads the gradient of the values from before
#   the copy and the source none, silently.
def _base_read_after_copy_into_its_slice(x, w, buf):
    y = x * 1
    y[1:3].copy_(w)
    return (y * y).sum()


def _base_read_after_copy_into_a_column_of_its_transpose(x, w, buf):
    y = x * 1
    y.t()[:, 2].copy_(w * 3)
    return (y * x).sum()


def _view_read_after_copy_into_its_base(x, w, buf):
    y = x * 1
    t = y.transpose(0, 1)
    y.copy_(w * 2)
    return (t * x.t()).sum()


def _view_read_before_and_after_copy_into_a_row(x, w, buf):
    y = x * w
    row = y[0]
    s = row.sum()
    y[0].copy_(w)
    return s + (row * x[1]).sum()


COPY_INTO_VIEW_GRAD_CASES = [
    _base_read_after_copy_into_its_slice,
    _base_read_after_copy_into_a_column_of_its_transpose,
    _view_read_after_copy_into_its_base,
    _view_read_before_and_after_copy_into_a_row,
]


@pytest.mark.parametrize("compile", ("jit", "thunderfx"))
@pytest.mark.parametrize("fn", COPY_INTO_VIEW_GRAD_CASES, ids=lambda fn: fn.__name__.strip("_"))
def test_gradient_of_reads_after_copy_into_a_view_like_eager(fn, compile):
    from thunder.dynamo import ThunderCompiler

    compiled = thunder.jit(fn) if compile == "jit" else torch.compile(fn, backend=ThunderCompiler())
    _check_value_and_gradients_like_eager(fn, compiled)


def _reshape_view_read_apart_from_a_copy(x, w, buf):
    y = x * 1
    v = y.reshape(-1)
    y[1].copy_(w)
    return (v[:3] * v[:3]).sum()


def _reshape_view_read_without_gradient_after_a_copy(x, w, buf):
    y = x * 1
    v = y.reshape(-1)
    y[0].copy_(w)
    return v.argmax() + (x[0] * w).sum()


def _reshape_view_read_over_a_copy(x, w, buf):
    y = x * 1
    v = y.reshape(-1)
    y[1].copy_(w)
    return (v * v).sum()


@pytest.mark.parametrize(
    "fn",
    [
        _reshape_view_read_apart_from_a_copy,
        _reshape_view_read_without_gradient_after_a_copy,
        pytest.param(
            _reshape_view_read_over_a_copy,
            marks=pytest.mark.xfail(
                strict=True, reason="a copy_ the rebaser refuses keeps stock's lowering: wrong gradient (stock too)"
            ),
        ),
    ],
    ids=lambda fn: fn.__name__.strip("_"),
)
def test_copy_the_rebaser_cannot_make_right_keeps_stocks_lowering(fn):
    # A reshape view read after the copy cannot be made again (a view or a copy, by strides). Raising, as for an
    #   indexed write, would fail programs stock runs right (the first two: the reads do not reach the copied
    #   elements' gradient); the copy is lowered as on stock instead, wrong where the reads do reach them.
    _check_value_and_gradients_like_eager(fn, thunder.jit(fn))


def _copy_into_a_slice_of_the_argument(buf, w):
    buf[1:3].view(-1)[:3].copy_(w)


@pytest.mark.parametrize("compile", ("jit", "thunderfx"))
def test_copy_into_a_view_of_an_argument_reaches_the_callers_gradient_like_eager(compile):
    # The argument is not returned: the caller reads it after the call, and its gradient must see the copy (the
    #   source gets the gradient of the copied elements, the argument's old values none there).
    from thunder.dynamo import ThunderCompiler

    fn = _copy_into_a_slice_of_the_argument
    compiled = thunder.jit(fn) if compile == "jit" else torch.compile(fn, backend=ThunderCompiler())
    results = []
    for f in (fn, compiled):
        x, w, _ = _view_inputs()
        buf = x * 1
        f(buf, w)
        weights = torch.arange(buf.numel(), dtype=buf.dtype).view(buf.shape)
        results.append((buf.detach(), torch.autograd.grad((buf * weights).sum(), (x, w), allow_unused=True)))
    (expected, expected_grads), (actual, actual_grads) = results
    assert torch.equal(actual, expected)
    torch.testing.assert_close(actual_grads, expected_grads)
