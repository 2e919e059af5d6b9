"""ThunderFX routes in-place indexed writes into graph inputs to Inductor (inplace_indexed_writes="inductor",
and, under the default "inplace", the ops Thunder has no in-place prim for).

Each test that claims the fix fails on the pristine base (`make stock-fails`): there the write runs in
Thunder as clone + copy back, which the trace helper finds, and no split reason names the write.
"""

from __future__ import annotations

import pytest
import torch
from expecttest import TestCase

from _support import describe_split, full_copies_in, split_reason_types, thunderfx


def _run_both(fn, make_args):
    """Run fn eagerly and under ThunderFX (all writes routed to Inductor) on identical fresh inputs."""
    eager_args = make_args()
    compiled_args = make_args()
    eager_out = fn(*eager_args)
    compiled, backend = thunderfx(fn, inplace_indexed_writes="inductor")
    ptrs = [a.data_ptr() if isinstance(a, torch.Tensor) else None for a in compiled_args]
    try:
        compiled_out = compiled(*compiled_args)
    except Exception as e:  # stock crashes on some of these forms; report it as this test's failure
        pytest.fail(f"ThunderFX raised {type(e).__name__}: {e}")
    return eager_args, eager_out, compiled_args, compiled_out, ptrs, backend


def _assert_same(eager, compiled):
    if isinstance(eager, torch.Tensor):
        assert isinstance(compiled, torch.Tensor)
        assert eager.dtype == compiled.dtype and eager.shape == compiled.shape
        assert torch.equal(eager, compiled), "not bitwise equal to eager"
    elif isinstance(eager, (tuple, list)):
        assert len(eager) == len(compiled)
        for e, c in zip(eager, compiled):
            _assert_same(e, c)
    else:
        assert eager == compiled


def _bf16(*shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(sum(shape))).to(torch.bfloat16)


@pytest.mark.claims_fix
class TestReportedGraph(TestCase):
    """`k_buffer[loc] = k` on a bf16 [N, 8, 64] buffer: the graph of the original report."""

    N = 4096

    def make_args(self):
        return _bf16(self.N, 8, 64), torch.tensor([1234]), _bf16(1, 8, 64)

    @staticmethod
    def write(k_buffer, loc, k):
        k_buffer[loc] = k

    def test_write_runs_in_an_inductor_segment(self):
        _, _, _, _, _, backend = _run_both(self.write, self.make_args)
        self.assertExpectedInline(
            describe_split(backend),
            """\
inductor: inductor_0(l_k_buffer_, l_loc_, l_k_)
    setitem = setitem(l_k_buffer_, l_loc_, l_k_)""",
        )

    def test_caller_buffer_updated_in_place_bitwise(self):
        eager_args, _, args, _, ptrs, backend = _run_both(self.write, self.make_args)
        buf = args[0]
        assert buf.data_ptr() == ptrs[0], "the write must land in the caller's storage"
        assert torch.equal(buf, eager_args[0])
        untouched = torch.ones(self.N, dtype=torch.bool)
        untouched[1234] = False
        assert torch.equal(buf[untouched], self.make_args()[0][untouched])
        assert torch.equal(buf[1234], args[2][0])
        assert full_copies_in(backend) == []

    def test_split_reason_names_the_write(self):
        _, _, _, _, _, backend = _run_both(self.write, self.make_args)
        assert split_reason_types(backend) == ["INPLACE_INDEXED_WRITE"]
        (reason,) = backend.subgraph_infos[0].split_reasons
        assert "setitem" in reason.info and "l_k_buffer_" in reason.info and "Inductor" in reason.info
        # Thunder's own report text (used by save_reproducer_to_folder and the FX reports) carries it.
        from thunder.dynamo.utils import get_split_reasons_string

        assert "writes in place by index into graph input l_k_buffer_" in get_split_reasons_string(
            backend.subgraph_infos[0]
        )


def _cache(*shape, dtype=torch.float32):
    return torch.arange(torch.Size(shape).numel(), dtype=torch.float32).reshape(shape).to(dtype)


# (id, fn, make_args). Every destination is a graph input or a view of one.
WRITE_FORMS = [
    ("setitem_tensor_key", lambda b, i, v: b.__setitem__(i, v), lambda: (_cache(32, 4), torch.tensor([3, 7]), -torch.ones(2, 4))),
    ("setitem_int_key", lambda b, v: b.__setitem__(5, v), lambda: (_cache(32, 4), -torch.ones(4))),
    ("setitem_slice_key", lambda b, v: b.__setitem__(slice(2, 6), v), lambda: (_cache(32, 4), -torch.ones(4, 4))),
    ("setitem_ellipsis_key", lambda b, v: b.__setitem__((Ellipsis, 1), v), lambda: (_cache(8, 4, 3), -torch.ones(8, 4))),
    ("setitem_bool_mask", lambda b, m: b.__setitem__(m, 0.0), lambda: (_cache(32, 4), _cache(32, 4) % 3 == 0)),
    ("setitem_scalar_value", lambda b, i: b.__setitem__(i, 7.0), lambda: (_cache(32, 4), torch.tensor([0, 31]))),
    ("view_chain_layer_then_loc", lambda c, i, v: c[1].__setitem__(i, v), lambda: (_cache(3, 16, 4), torch.tensor([2]), -torch.ones(1, 4))),
    ("tuple_key_layer_loc", lambda c, i, v: c.__setitem__((1, i), v), lambda: (_cache(3, 16, 4), torch.tensor([2, 9]), -torch.ones(2, 4))),
    ("gpt_fast_slices_then_pos", lambda c, p, v: c.__setitem__((slice(None), slice(None), p), v), lambda: (_cache(1, 2, 16, 4), torch.tensor([5]), -torch.ones(1, 2, 1, 4))),
    ("view_chain_transpose", lambda c, i, v: c.transpose(0, 1).__setitem__(i, v), lambda: (_cache(4, 16), torch.tensor([3]), -torch.ones(1, 4))),
    ("index_copy_hf_static_cache", lambda c, p, v: c.index_copy_(2, p, v), lambda: (_cache(1, 2, 16, 4), torch.tensor([6]), -torch.ones(1, 2, 1, 4))),
    ("index_copy_via_view", lambda c, p, v: c[0].index_copy_(1, p, v), lambda: (_cache(2, 2, 16, 4), torch.tensor([6, 1]), -torch.ones(2, 2, 4))),
    ("index_put_", lambda b, i, v: b.index_put_((i,), v), lambda: (_cache(32, 4), torch.tensor([3, 9]), -torch.ones(2, 4))),
    ("torch_index_put_accumulate", lambda b, i, v: torch.index_put_(b, (i,), v, accumulate=True), lambda: (_cache(32, 4), torch.tensor([3, 3]), torch.ones(2, 4))),
    ("aten_index_put_overload", lambda b, i, v: torch.ops.aten.index_put_.default(b, [i], v), lambda: (_cache(32, 4), torch.tensor([4]), -torch.ones(1, 4))),
    ("index_add_alpha", lambda b, i, v: b.index_add_(0, i, v, alpha=2), lambda: (_cache(32, 4), torch.tensor([1, 1, 5]), torch.ones(3, 4))),
    ("index_fill_", lambda b, i: b.index_fill_(1, i, -1.0), lambda: (_cache(32, 4), torch.tensor([0, 2]))),
    ("scatter_src", lambda b, i, v: b.scatter_(0, i, v), lambda: (_cache(32, 4), torch.tensor([[1, 2, 3, 4]]), -torch.ones(1, 4))),
    ("scatter_value", lambda b, i: b.scatter_(1, i, 9.0), lambda: (_cache(32, 4), torch.tensor([[1], [3]]))),
    ("scatter_add_", lambda b, i, v: b.scatter_add_(0, i, v), lambda: (_cache(32, 4), torch.tensor([[1, 1, 2, 2]]), torch.ones(1, 4))),
    ("scatter_reduce_", lambda b, i, v: b.scatter_reduce_(0, i, v, "amax"), lambda: (_cache(32, 4), torch.tensor([[1, 1, 2, 2]]), 1000 * torch.ones(1, 4))),
    ("masked_fill_", lambda b, m: b.masked_fill_(m, -3.0), lambda: (_cache(32, 4), _cache(32, 4) % 5 == 1)),
    ("bf16_setitem", lambda b, i, v: b.__setitem__(i, v), lambda: (_cache(32, 8, dtype=torch.bfloat16), torch.tensor([1]), -torch.ones(1, 8, dtype=torch.bfloat16))),
    ("int64_index_copy", lambda b, i, v: b.index_copy_(0, i, v), lambda: (_cache(32, 4, dtype=torch.int64), torch.tensor([2]), -torch.ones(1, 4, dtype=torch.int64))),
]


@pytest.mark.claims_fix
@pytest.mark.parametrize("fn, make_args", [pytest.param(f, m, id=i) for i, f, m in WRITE_FORMS])
def test_write_form_routed_and_lands_in_caller_storage(fn, make_args):
    eager_args, eager_out, args, out, ptrs, backend = _run_both(fn, make_args)
    assert args[0].data_ptr() == ptrs[0]
    _assert_same(eager_args, args)
    assert full_copies_in(backend) == [], "a Thunder segment still copies the whole destination"
    assert "INPLACE_INDEXED_WRITE" in split_reason_types(backend)


@pytest.mark.claims_fix
class TestMixedGraphs(TestCase):
    def test_reads_before_and_after_the_write_see_eager_values(self):
        def step(buf, loc, k, read_loc):
            before = buf[read_loc] * 2  # read of the rows about to be overwritten
            buf[loc] = k
            after = buf.sum(0) + buf[read_loc]
            return before, after

        def make_args():
            return _cache(64, 4), torch.tensor([10, 11]), -torch.ones(2, 4), torch.tensor([11, 12])

        eager_args, eager_out, args, out, ptrs, backend = _run_both(step, make_args)
        _assert_same(eager_out, out)
        _assert_same(eager_args, args)
        assert args[0].data_ptr() == ptrs[0]
        assert full_copies_in(backend) == []
        self.assertExpectedInline(
            describe_split(backend),
            """\
thunder: thunder_0(l_buf_, l_read_loc_)
    getitem = getitem(l_buf_, l_read_loc_)
    before = mul(getitem, 2)
inductor: inductor_1(l_buf_, l_loc_, l_k_)
    setitem = setitem(l_buf_, l_loc_, l_k_)
thunder: thunder_2(l_buf_, l_read_loc_)
    sum_1 = .sum(l_buf_, 0)
    getitem_1 = getitem(l_buf_, l_read_loc_)
    after = add(sum_1, getitem_1)""",
        )

    def test_view_used_by_thunder_and_by_the_write(self):
        # The view `layer` feeds both a Thunder op and the write: the write gets its own copy of the view.
        def step(cache, loc, k):
            layer = cache[1]
            norm = layer.abs().sum()
            layer[loc] = k
            return norm, layer.sum()

        def make_args():
            return _cache(3, 16, 4), torch.tensor([4]), -torch.ones(1, 4)

        eager_args, eager_out, args, out, ptrs, backend = _run_both(step, make_args)
        _assert_same(eager_out, out)
        _assert_same(eager_args, args)
        assert full_copies_in(backend) == []
        assert split_reason_types(backend) == ["INPLACE_INDEXED_WRITE"]

    def test_kv_writes_of_two_layers_each_write_its_own_inductor_segment(self):
        def step(k_pool, v_pool, loc, k, v):
            for layer in range(2):
                k_pool[layer][loc] = k[layer]
                v_pool[layer][loc] = v[layer]
            return (k_pool[:, loc] * v_pool[:, loc]).sum()

        def make_args():
            return _cache(2, 32, 2, 4), _cache(2, 32, 2, 4) + 1, torch.tensor([7]), -torch.ones(2, 1, 2, 4), torch.ones(2, 1, 2, 4)

        eager_args, eager_out, args, out, ptrs, backend = _run_both(step, make_args)
        _assert_same(eager_out, out)
        _assert_same(eager_args, args)
        assert full_copies_in(backend) == []
        assert split_reason_types(backend).count("INPLACE_INDEXED_WRITE") == 4
        # Each write carries its own view chain (getitem of the pool) into its Inductor segment. The
        # value views k[layer] stay in Thunder between the writes, so every write is its own segment:
        # the cost of routing that the "inplace" policy avoids.
        kinds = [line.split(":")[0] for line in describe_split(backend).splitlines() if not line.startswith(" ")]
        assert kinds == ["thunder", "inductor"] * 4 + ["thunder"]


@pytest.mark.claims_fix
def test_module_buffer_written_in_place():
    class KVCache(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("k_cache", _cache(1, 2, 16, 4))

        def forward(self, pos, k):
            self.k_cache[:, :, pos] = k
            return self.k_cache.sum()

    eager, compiled_module = KVCache(), KVCache()
    pos, k = torch.tensor([3]), -torch.ones(1, 2, 1, 4)
    expected = eager(pos, k)
    compiled, backend = thunderfx(compiled_module, inplace_indexed_writes="inductor")
    ptr = compiled_module.k_cache.data_ptr()
    assert torch.equal(compiled(pos, k), expected)
    assert compiled_module.k_cache.data_ptr() == ptr
    assert torch.equal(compiled_module.k_cache, eager.k_cache)
    assert full_copies_in(backend) == []
    assert "INPLACE_INDEXED_WRITE" in split_reason_types(backend)


def test_write_into_intermediate_stays_in_thunder():
    # MoE style: the destination is created in the graph, so no caller-visible tensor is copied.
    def moe_gather(outs, idxs):
        new_x = torch.empty_like(outs)
        new_x[idxs] = outs
        return new_x

    outs, idxs = _cache(8, 4), torch.randperm(8, generator=torch.Generator().manual_seed(0))
    compiled, backend = thunderfx(moe_gather, inplace_indexed_writes="inductor")
    assert torch.equal(compiled(outs, idxs), moe_gather(outs, idxs))
    assert "INPLACE_INDEXED_WRITE" not in split_reason_types(backend)
    assert [i.thunder_compiled_fns != [] for i in backend.subgraph_infos] == [True]


def test_functional_policy_keeps_stock_lowering():
    def write(buf, loc, k):
        buf[loc] = k

    buf, loc, k = _cache(64, 4), torch.tensor([1]), -torch.ones(1, 4)
    compiled, backend = thunderfx(write, inplace_indexed_writes="functional")
    compiled(buf, loc, k)
    assert torch.equal(buf[1], k[0])
    assert split_reason_types(backend) == []
    kinds = [c.kind for c in full_copies_in(backend)]
    assert kinds == ["copy_with_setitem", "copy_"]


@pytest.mark.claims_fix
def test_unknown_policy_is_rejected():
    from thunder.dynamo import ThunderCompiler

    with pytest.raises(ValueError, match="inplace_indexed_writes='bogus' is not supported"):
        ThunderCompiler(inplace_indexed_writes="bogus")


@pytest.mark.claims_fix
@pytest.mark.parametrize(
    "fn, make_args",
    [pytest.param(f, m, id=i) for i, f, m in WRITE_FORMS if i in ("masked_fill_", "index_fill_", "scatter_reduce_")],
)
def test_default_policy_routes_ops_thunder_cannot_write_in_place(fn, make_args):
    eager_args = make_args()
    args = make_args()
    fn(*eager_args)
    compiled, backend = thunderfx(fn)
    compiled(*args)
    _assert_same(eager_args, args)
    assert split_reason_types(backend) == ["INPLACE_INDEXED_WRITE"]
    assert full_copies_in(backend) == []


@pytest.mark.claims_fix
class TestDefaultPolicyWritesInPlaceInThunder(TestCase):
    """ThunderCompiler() (inplace_indexed_writes="inplace"): the reported graph is one Thunder segment
    whose trace writes the buffer with one in-place op."""

    def test_reported_graph_is_one_thunder_segment_with_one_inplace_write(self):
        import thunder

        def write(k_buffer, loc, k):
            k_buffer[loc] = k

        buf, loc, k = _bf16(4096, 8, 64), torch.tensor([1234]), _bf16(1, 8, 64)
        expected = buf.clone()
        expected[loc] = k
        ptr = buf.data_ptr()
        compiled, backend = thunderfx(write)
        compiled(buf, loc, k)
        assert buf.data_ptr() == ptr and torch.equal(buf, expected)
        self.assertExpectedInline(
            describe_split(backend),
            """\
thunder: thunder_0(l_k_buffer_, l_loc_, l_k_)
    setitem = setitem(l_k_buffer_, l_loc_, l_k_)""",
        )
        (fn,) = backend.subgraph_infos[0].thunder_compiled_fns
        body = [ln.strip() for ln in str(thunder.last_traces(fn)[-1]).splitlines() if ln.startswith("  ") and ".py:" not in ln and "<eval_with_key>" not in ln]
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
        assert full_copies_in(backend) == []


def _add_one_then_masked_fill_then_write(buf, loc, k):
    x = buf.add_(1)
    x.masked_fill_(x > 5, 0.0)
    x[loc] = k
    return x.sum()


def _add_one_then_write(buf, loc, k):
    x = buf.add_(1)
    x[loc] = k
    return x.sum()


@pytest.mark.keeps_stock_behaviour
@pytest.mark.parametrize("policy", ["inplace", "inductor"])
@pytest.mark.parametrize("fn", [_add_one_then_masked_fill_then_write, _add_one_then_write])
def test_write_through_the_result_of_an_inplace_op_runs_that_op_once(fn, policy):
    # Regression: the chain moved with a routed write held `buf.add_(1)`, which then ran twice
    # (33.0 instead of 24.0 and a wrong buffer, no error). Only pure views may move with a write.
    make_args = lambda: (torch.ones(4, 3), torch.tensor([1]), torch.zeros(1, 3))
    eager_args, args = make_args(), make_args()
    expected = fn(*eager_args)
    compiled, backend = thunderfx(fn, inplace_indexed_writes=policy)
    result = compiled(*args)
    assert torch.equal(result, expected), f"{float(result)} != eager's {float(expected)}"
    _assert_same(eager_args, args)
