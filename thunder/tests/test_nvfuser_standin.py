"""The CPU stand-in for nvFuser (thunder/tests/nvfuser_standin.py) is nvFuser's executor with torch
kernels: it claims what nvfuserex_impl.py registers, runs nvFuser's fusion pass, keeps nvFuser's
meaning of ``copy_`` inside a fusion, and leaves nvFuser unavailable to everything else."""

import ast
import importlib.util
import sys
from pathlib import Path

import pytest
import torch

import thunder
import thunder.executors.nvfuserex as nvfuserex
from thunder.core import prims
from thunder.tests.framework import instantiate, nvFuserStandinExecutor, NOTHING
from thunder.tests.nvfuser_standin import TorchFusion, claimed_ids, executors_with_standin, nvfuser_standin_ex
import thunder.tests.nvfuser_standin as standin

REAL_NVFUSER = nvfuserex.nvfuser_available()


def _registered_ids() -> set:
    """What nvfuserex_impl.py registers, read from its source: the first argument of every
    register_supported / register_dtensor_supported / ex.register_supported call, evaluated in the
    module the stand-in loaded."""
    tree = ast.parse(Path(nvfuserex.__file__).with_name("nvfuserex_impl.py").read_text())
    ids = set()
    calls = [stmt.value for stmt in tree.body if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)]
    for node in calls:  # registrations are module-level calls
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
        if name not in ("register_supported", "register_dtensor_supported") or not node.args:
            continue
        target = eval(compile(ast.Expression(node.args[0]), "<nvfuserex_impl>", "eval"), vars(standin._impl))
        ids.add(getattr(target, "id", target))
    return ids


def test_claims_are_the_registrations_of_nvfusers_executor():
    registered = _registered_ids()
    assert len(registered) > 100
    assert set(standin._impl.ex.implmap) == registered
    # only claims whose execution is an nvFuser-only operator are left out
    left_out = registered - claimed_ids()
    assert left_out == {i for i in registered if standin._needs_nvfuser_only_operator(i, standin._impl.ex.implmap[i])}
    assert {"torch.nn.functional.scaled_dot_product_attention", "torch.nn.functional.cross_entropy"} <= left_out
    assert prims.PrimIDs.COPY_ in claimed_ids() and prims.PrimIDs.INDEX_PUT in claimed_ids()


@pytest.mark.skipif(REAL_NVFUSER, reason="nvFuser is installed here: it is meant to be visible")
def test_nvfuser_stays_unavailable():
    assert not thunder.executors.nvfuser_available()
    assert thunder.extend.get_executor("nvfuser") is None
    assert thunder.extend.get_executor("nvfuser_standin") is nvfuser_standin_ex
    assert "nvfuser" not in sys.modules and "nvfuser_direct" not in sys.modules
    assert importlib.util.find_spec("nvfuser") is None and importlib.util.find_spec("nvfuser_direct") is None
    assert nvfuser_standin_ex not in thunder.get_default_executors()


def test_executors_with_standin_take_nvfusers_place():
    # on a GPU: [cudnn, sdpa, torchcompile_xentropy, nvfuser] + the always-executors [torch, python]
    defaults = [ex.name for ex in thunder.get_default_executors() if ex.name != "nvfuser"]
    assert [ex.name for ex in executors_with_standin()] == defaults + ["nvfuser_standin"]
    all_executors = [*thunder.get_default_executors(), *thunder.extend.get_always_executors()]
    with_torch = [ex.name for ex in executors_with_standin(all_executors)]
    assert with_torch == defaults + ["nvfuser_standin", "torch", "python"]


def _fusions(jfn):
    return [b for b in thunder.last_traces(jfn)[-1].bound_symbols if b.sym.is_fusion]


@instantiate(executors=(nvFuserStandinExecutor,), dtypes=NOTHING)
def test_fuses_elementwise_ops_and_matches_eager(executor, device, _):
    def f(a, b):
        return (a * 2 + b).sin().sum(0), (a - b).exp()

    a, b = torch.randn(4, 3, device=device), torch.randn(4, 3, device=device)
    jfn = executor.make_callable(f)
    actual, expected = jfn(a, b), f(a, b)
    for x, y in zip(actual, expected):
        torch.testing.assert_close(x, y)
    fusions = _fusions(jfn)
    assert [b.sym.name for b in fusions] == ["nvFusion0"]
    assert fusions[0].sym.executor is nvfuser_standin_ex


def test_nv_enable_scatter_decides_whether_index_put_is_fused():
    def f(a, i, v):
        return torch.index_put(a, (i,), v) * 2

    args = (torch.zeros(5, 2), torch.tensor([1, 3]), torch.ones(2, 2))
    for enable, index_put_fused in ((None, False), (True, True)):
        options = {} if enable is None else {"nv_enable_scatter": enable}
        jfn = thunder.jit(f, executors=executors_with_standin(), **options)
        torch.testing.assert_close(jfn(*args), f(*args), rtol=0, atol=0)
        fused = {b.sym.name for fusion in _fusions(jfn) for b in fusion.subsymbols}
        assert "mul" in fused and ("index_put" in fused) == index_put_fused, fused


def test_copy_in_a_fusion_writes_its_destination_at_the_end():
    """nvFuser's copy_: reads of the destination in the fusion see its old value, the destination is
    written when the fusion ends, and the result, as an output, is the destination's tensor."""

    def region(dst, src):
        out = prims.copy_(src, dst, grad_enabled=False)
        return out, prims.mul(dst, 2.0)

    dst, src = torch.arange(4.0), torch.full((4,), 7.0)
    trace = thunder.trace()(region, dst, src)
    bsyms = [b for b in trace.bound_symbols if b.sym.id not in (prims.PrimIDs.UNPACK_TRIVIAL, prims.PrimIDs.RETURN)]
    (out_proxy, doubled_proxy) = trace.output
    fusion = TorchFusion(bsyms, "nvFusion0", list(trace.args), [out_proxy, doubled_proxy])
    out, doubled = fusion(dst, src)
    assert torch.equal(doubled, torch.arange(4.0) * 2)  # read before the write landed
    assert torch.equal(dst, src)
    assert out is dst  # an output aliased to an input is the input's tensor (ReuseBuffer)


def test_write_into_the_result_of_a_fused_copy_lands_in_the_destination():
    """`buf[1:2] = v0; buf.copy_(v1)` under grad: the first write is copy_with_setitem + copy_ into buf
    in one fusion, and the second copy_ writes that copy_'s result in the next one. nvFuser returns the
    destination for it, so the second write lands in buf too (with a new tensor, buf would keep v0)."""

    def f(buf, v0, v1):
        r0 = buf * -1
        buf[1:2] = v0
        buf.copy_(v1)
        return r0

    leaf, v0, v1 = (torch.randn(n, requires_grad=True) for n in (2, 1, 2))
    expected_buf, buf = leaf.clone(), leaf.clone()
    expected = f(expected_buf, v0, v1)
    jfn = thunder.jit(f, executors=executors_with_standin())
    torch.testing.assert_close(jfn(buf, v0, v1), expected)
    torch.testing.assert_close(buf, expected_buf)


def test_copy_into_an_input_lands_in_the_callers_tensor():
    def f(buf, k):
        s = buf.sin()
        buf.copy_(k * 2)
        return s

    buf, k = torch.randn(3, 4), torch.randn(3, 4)
    expected_buf = buf.clone()
    expected = f(expected_buf, k)
    jfn = thunder.jit(f, executors=executors_with_standin())
    actual = jfn(buf, k)
    assert torch.equal(actual, expected) and torch.equal(buf, expected_buf)
    assert "copy_" in {b.sym.name for fusion in _fusions(jfn) for b in fusion.subsymbols}


def test_thunderfx_runs_the_standin():
    from thunder.dynamo import ThunderCompiler

    def f(a, b):
        return (a * b).cos() + 1

    torch._dynamo.reset()
    backend = ThunderCompiler(executors=executors_with_standin())
    cfn = torch.compile(f, backend=backend, fullgraph=True)
    a, b = torch.randn(5), torch.randn(5)
    torch.testing.assert_close(cfn(a, b), f(a, b), rtol=0, atol=0)
    names = [
        b.sym.name
        for info in backend.subgraph_infos
        for fn in info.thunder_compiled_fns
        for b in thunder.last_traces(fn)[-1].bound_symbols
    ]
    assert "nvFusion0" in names
