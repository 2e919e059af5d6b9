import pytest
import torch
from torch.testing import assert_close

import thunder
from thunder.examine.full_size_copies import peak_memory_growth


def _bound_symbol_names(jfn) -> list[str]:
    return [bsym.sym.name for bsym in thunder.last_traces(jfn)[-1].bound_symbols]


def _inputs(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(64, 33, generator=g), torch.randn(64, 33, generator=g)


_WHOLE_TENSOR_WRITES = {
    "sub_": lambda x, y: x.sub_(y),
    "sub_alpha": lambda x, y: x.sub_(y, alpha=0.5),
    "mul_": lambda x, y: x.mul_(y),
    "div_": lambda x, y: x.div_(y),
    "add_scalar": lambda x, y: x.add_(3.0),
    "clamp_": lambda x, y: x.clamp_(-0.5, 0.5),
    "exp_": lambda x, y: x.exp_(),
}


@pytest.mark.parametrize("name", list(_WHOLE_TENSOR_WRITES))
@pytest.mark.parametrize("frontend", ["jit", "thunderfx"])
def test_whole_tensor_in_place_op_on_an_input_runs_in_place(name, frontend):
    write = _WHOLE_TENSOR_WRITES[name]

    def f(x, y):
        write(x, y)
        return x

    expected_x, y = _inputs()
    write(expected_x, y)
    x, y = _inputs()
    ptr = x.data_ptr()
    if frontend == "jit":
        jf = thunder.jit(f)
        out = jf(x, y)
        names = _bound_symbol_names(jf)
    else:
        from thunder.dynamo import ThunderCompiler

        torch._dynamo.reset()
        backend = ThunderCompiler()
        out = torch.compile(f, backend=backend)(x, y)
        (fn,) = backend.subgraph_infos[0].thunder_compiled_fns
        names = _bound_symbol_names(fn)
    torch.testing.assert_close(x, expected_x, rtol=0, atol=0)  # bitwise, in the caller's tensor
    assert x.data_ptr() == ptr and out.data_ptr() == ptr
    assert "copy_" not in names, names


def test_whole_tensor_write_under_torch_compile_ex_lands_in_the_input():
    # The rewrite is the torch executor's; a fusion executor keeps the op and the copy in its region.
    from thunder.executors.torch_compile import torch_compile_ex

    expected_x, y = _inputs(3)
    expected_x.sub_(y)
    x, y = _inputs(3)
    jf = thunder.jit(lambda x, y: x.sub_(y), executors=[torch_compile_ex])
    jf(x, y)
    assert_close(x, expected_x)


def test_whole_tensor_sub_into_an_input_allocates_nothing():
    # [128, 151936] float32 logits are 74 MiB; a quarter of the rows shows the same.
    x, y = torch.randn(32, 151936), torch.randn(32, 151936)
    jf = thunder.jit(lambda x, y: x.sub_(y))
    jf(x, y)
    growth = peak_memory_growth(jf, x, y)
    assert growth < x.numel() * x.element_size() // 8, f"{growth / 2**20:.1f} MiB"


def _keeps_old_value_cases():
    def read_before(x, y):
        r = x.sum(0)
        x.sub_(y)
        return r, x

    def view_read_after(x, y):
        v = x[1:3]
        x.mul_(y)
        return v * 1, x

    def overlapping_argument(x, y):
        x.mul_(x.flip(0))
        return x

    def same_argument(x, y):
        x.add_(x)
        return x

    def promoted_dtype(x, y):
        x.add_(y.double())
        return x

    def result_returned_twice(x, y):
        x.sub_(y)
        return x, x + 1

    return [read_before, view_read_after, overlapping_argument, same_argument, promoted_dtype, result_returned_twice]


@pytest.mark.parametrize("f", _keeps_old_value_cases(), ids=lambda f: f.__name__)
def test_writes_that_must_keep_the_old_value_give_eagers_results(f):
    expected_x, y = _inputs(1)
    expected = f(expected_x, y)
    x, y = _inputs(1)
    out = thunder.jit(f)(x, y)
    assert_close(out, expected, rtol=0, atol=0)
    assert_close(x, expected_x, rtol=0, atol=0)


def test_write_under_grad_keeps_the_functional_form():
    def f(x, y):
        z = x * 2
        z.mul_(y)
        return z.sum()

    x, y = _inputs(2)
    x.requires_grad_(True)
    jf = thunder.jit(f)
    out = jf(x, y)
    out.backward()
    x_ref = x.detach().clone().requires_grad_(True)
    f(x_ref, y).backward()
    assert_close(out, f(x_ref.detach(), y), rtol=0, atol=0)
    assert_close(x.grad, x_ref.grad, rtol=0, atol=0)
