"""In-place indexed writes under fusion executors: nvFuser (on CUDA), its CPU stand-in
(thunder/tests/nvfuser_standin.py, nvFuser's fusion pass with torch kernels) and Thunder's
torch.compile executor.

Fusion executors reorder and merge work: dataflow fusion, rematerialization, CSE, DCE. Every write
form of test_inplace_indexed_writes.py runs here between a read of its destination before the write
(which must see the old values) and one after it; the caller's buffer must equal eager's bitwise
(the write lands in its storage). Values the fusion computes are compared with assert_close (nvFuser
and Inductor need not round like eager). Then the cases these passes are known to meet: a fused read
rematerialized after the write, CSE of reads on either side of a write, a write into a clone of an
input (upstream #2793), nv_enable_scatter, and a decode step under Thunder's CUDA-graph transform,
whose write must land in the caller's cache and not in a static copy.
"""

import pytest
import torch

import thunder
from thunder.tests.framework import (
    NOTHING,
    TorchCompileExecutor,
    instantiate,
    nvFuserExecutor,
    nvFuserStandinExecutor,
)
from thunder.tests.test_inplace_indexed_writes import _CASES, _outcome

# nvFuser is None where it is not installed (@instantiate skips it); the stand-in runs on the CPU only.
NVFUSER_EXECUTORS = (nvFuserExecutor, nvFuserStandinExecutor)
ALL_FUSION_EXECUTORS = (*NVFUSER_EXECUTORS, TorchCompileExecutor)
# Inductor compiles each case for seconds on a CPU: it runs a few forms, the nvFuser ones every form.
TORCH_COMPILE_CASES = ("setitem_tensor", "gpt_fast", "index_put", "index_add", "scatter_src", "masked_fill")


def _float_args(case: str, device: str):
    fn, make_args = _CASES[case]
    torch.manual_seed(0)
    args = make_args(torch.float32)
    args = tuple(a + torch.randn(a.shape) if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args)
    return fn, tuple(a.to(device) if isinstance(a, torch.Tensor) else a for a in args)


def _with_reads(fn):
    """fn between a fusible read of its destination before the write and one after it."""

    def wrapped(buf, *rest):
        before = (buf * 2).sin()
        out = fn(buf, *rest)
        after = (buf * 3).cos()
        return before, after, out

    return wrapped


def _clones(args):
    return tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)


def _check_like_eager(executor, fn, args, **compile_options):
    eager_args, compiled_args = _clones(args), _clones(args)
    expected = fn(*eager_args)
    cfn = executor.make_callable(fn, **compile_options)
    actual = cfn(*compiled_args)
    for i, (e, a) in enumerate(zip(eager_args, compiled_args)):
        if isinstance(e, torch.Tensor):
            assert torch.equal(a, e), f"argument {i} after the call differs from eager's"
    torch.testing.assert_close(actual, expected)
    return cfn


def _write_form_with_reads(executor, device, _, case):
    fn, args = _float_args(case, device)
    _check_like_eager(executor, _with_reads(fn), args)


instantiate(
    executors=NVFUSER_EXECUTORS,
    dtypes=NOTHING,
    decorators=(pytest.mark.parametrize("case", sorted(_CASES)),),
    as_name="test_write_form_with_reads_around_it",
)(_write_form_with_reads)
instantiate(
    executors=(TorchCompileExecutor,),
    dtypes=NOTHING,
    decorators=(pytest.mark.parametrize("case", TORCH_COMPILE_CASES),),
    as_name="test_write_form_with_reads_around_it",
)(_write_form_with_reads)


@instantiate(
    executors=NVFUSER_EXECUTORS,
    dtypes=NOTHING,
    decorators=(pytest.mark.parametrize("case", ("setitem_tensor", "index_put", "scatter_src", "scatter_value")),),
)
def test_write_form_with_nv_enable_scatter(executor, device, _, case):
    """nv_enable_scatter lets nvFuser claim the functional index_put and scatter as well."""
    fn, args = _float_args(case, device)
    _check_like_eager(executor, _with_reads(fn), args, nv_enable_scatter=True)


@instantiate(executors=ALL_FUSION_EXECUTORS, dtypes=NOTHING)
def test_fused_read_is_not_rematerialized_after_the_write(executor, device, _):
    def f(buf, loc, k, y):
        s = (buf * 2).sin()
        buf[loc] = k
        return s + y

    args = (torch.randn(8, 4), torch.tensor([1, 3]), torch.randn(2, 4), torch.randn(8, 4))
    _check_like_eager(executor, f, tuple(a.to(device) for a in args))


@instantiate(executors=ALL_FUSION_EXECUTORS, dtypes=NOTHING)
def test_reads_on_either_side_of_a_write_are_not_merged(executor, device, _):
    """The same expression of the destination before and after a write: CSE must keep both."""

    def f(buf, loc, k):
        a = buf * 2
        buf.index_copy_(0, loc, k)
        b = buf * 2
        return a, b

    args = (torch.randn(6, 3), torch.tensor([4, 0]), torch.randn(2, 3))
    _check_like_eager(executor, f, tuple(a.to(device) for a in args))


@instantiate(executors=ALL_FUSION_EXECUTORS, dtypes=NOTHING)
def test_write_into_a_clone_leaves_the_input_alone(executor, device, _):
    """Upstream #2793: `y = x.clone(); y[i] = v` must not write x, nor make y an alias of x."""

    def f(x, i, v):
        y = x.clone()
        y[i] = v
        return y, x * 1

    args = (torch.randn(5, 2), torch.tensor([0, 3]), torch.randn(2, 2))
    _check_like_eager(executor, f, tuple(a.to(device) for a in args))


@instantiate(executors=ALL_FUSION_EXECUTORS, dtypes=NOTHING)
def test_write_refused_under_grad_raises_after_the_statements_before_it(executor, device, _):
    """A write where a gradient flows that thunder.jit cannot make right (``y`` and ``v`` share storage, ``v`` is
    read after a write into ``y``) raises when the computation reaches it: fused or not, an index error of a
    write before it comes first, as in eager, and ``y`` is left as it was."""

    def f(y, v, w, i):
        z = (y * 2).sin()
        z.index_copy_(0, i, w[None])
        y[1] = w
        return (v * 2).sum() + z.sum()

    x = torch.randn(4, 3, device=device, requires_grad=True)
    w = torch.randn(3, device=device, requires_grad=True)
    # A CUDA kernel's index error is an asynchronous device assert, not eager's IndexError; Inductor's index_copy
    #   takes -1 as the last row (torch.compile's own behaviour, stock's too).
    eager_index_checks = device == "cpu" and executor is not TorchCompileExecutor
    cases = [(3, NotImplementedError)] + ([(-1, IndexError)] if eager_index_checks else [])
    for index, error in cases:
        y = x * 1
        before = y.detach().clone()
        raised = _outcome(lambda: executor.make_callable(f)(y, y[1:], w, torch.tensor([index], device=device)))
        assert type(raised) is error, f"index {index}: eager's outcome is {error.__name__}, got {raised!r}"
        assert torch.equal(y.detach(), before)


def _write_through_diagonals_of_an_argument(b, v):
    before = (b * 2).sum(0)
    b.diagonal().copy_(v)
    b.diagonal(1).mul_(3.0)
    b.unsqueeze(0).diagonal(0, 1, 2)[1:3].fill_(0.5)
    d = b.diagonal()
    d.add_(v.sin())  # the view and sin are one fusion region unless the view stays out of fusions
    return before, b * 1


def _write_through_diagonals_of_a_tensor_made_inside(x, v):
    y = x * 2
    d = y.diagonal(-1)
    s = v.cos()
    d.zero_()
    y.diagonal().add_(v)
    return y, s


@instantiate(
    executors=ALL_FUSION_EXECUTORS,
    dtypes=NOTHING,
    decorators=(
        pytest.mark.parametrize(
            "fn", (_write_through_diagonals_of_an_argument, _write_through_diagonals_of_a_tensor_made_inside)
        ),
        pytest.mark.parametrize("frontend", ("jit", "thunderfx")),
    ),
)
def test_write_through_a_diagonal_lands_in_its_base(executor, device, _, fn, frontend):
    """``diagonal``'s prims are a gather: made inside a fusion, the "view" is a new tensor and a write into it
    never reaches its base (nvFuser fused it, stock too). A view of a written storage is made outside fusions."""
    args = (torch.randn(4, 5, device=device), torch.randn(4, device=device))
    if frontend == "jit":
        _check_like_eager(executor, fn, args)
        return
    from thunder.dynamo import ThunderCompiler

    torch._dynamo.reset()
    eager_args, compiled_args = _clones(args), _clones(args)
    expected = fn(*eager_args)
    actual = torch.compile(fn, backend=ThunderCompiler(executors=executor.executors_list()))(*compiled_args)
    assert torch.equal(compiled_args[0], eager_args[0]), "the argument after the call differs from eager's"
    torch.testing.assert_close(actual, expected)


@pytest.mark.skipif(nvFuserExecutor is None, reason="needs nvFuser on CUDA")
def test_decode_step_under_cuda_graphs_writes_the_callers_cache():
    """Thunder's CUDA-graph transform copies arguments into static buffers: the write must still land
    in the caller's cache, step after step, and reads must see it."""
    from thunder.transforms.cudagraph import CUDAGraphTransform

    def step(k_cache, pos, k, q):
        k_cache.index_copy_(2, pos, k)
        return (q @ k_cache.transpose(-1, -2)).softmax(-1)

    cache = torch.zeros(1, 2, 16, 8, device="cuda")
    eager_cache = cache.clone()
    jstep = thunder.jit(step, transforms=[CUDAGraphTransform()])
    for t in range(3):
        pos = torch.tensor([t], device="cuda")
        k, q = torch.randn(1, 2, 1, 8, device="cuda"), torch.randn(1, 2, 1, 8, device="cuda")
        expected = step(eager_cache, pos, k, q)
        actual = jstep(cache, pos, k, q)
        assert torch.equal(cache, eager_cache), f"step {t}: the caller's cache misses the write"
        torch.testing.assert_close(actual, expected)
    names = {b.sym.name for b in thunder.last_traces(jstep)[-1].bound_symbols}
    assert any(n.startswith("CUDAGraph") for n in names), names
