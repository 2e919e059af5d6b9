"""The trace helper thunder.examine.full_size_copies finds the full-size copies stock Thunder makes."""

from __future__ import annotations

import torch
from expecttest import TestCase

from _support import full_copies_in, full_size_copies, thunderfx


def _write(k_buffer, loc, k):
    k_buffer[loc] = k


class TestFindFullSizeCopies(TestCase):
    def test_flags_stock_lowering_of_the_reported_graph(self):
        n = 1024
        # "functional" is the stock lowering; on the pristine base it is the only one.
        compiled, backend = thunderfx(_write, inplace_indexed_writes="functional")
        compiled(torch.zeros(n, 8, 64, dtype=torch.bfloat16), torch.tensor([3]), torch.ones(1, 8, 64, dtype=torch.bfloat16))
        found = full_copies_in(backend)
        self.assertExpectedInline(
            "".join(f"{c}\n" for c in found),
            """\
copy_with_setitem of l_k_buffer_ [1024, 8, 64] (1048576 bytes): t7 = copy_with_setitem_impl(t6, l_loc_, l_k_)  # t7: "cpu bf16[1024, 8, 64]"
copy_ of l_k_buffer_ [1024, 8, 64] (1048576 bytes): t8 = copy_(t7, t6, grad_enabled=True)  # t8: "cpu bf16[1024, 8, 64]"
""",
        )
        (trace,) = full_size_copies.thunderfx_execution_traces(backend)
        assert full_size_copies.full_size_copy_bytes(trace) == 2 * n * 8 * 64 * 2

    def test_flags_functional_ops_copied_back_and_follows_views(self):
        import thunder

        def f(cache, idx, src, pos, k):
            cache.index_copy_(0, idx, src)
            cache[1].index_put_((pos,), k)
            return cache.sum()

        # The stock lowering; the pristine base ignores the option it does not know.
        jf = thunder.jit(f, inplace_indexed_writes="functional")
        jf(torch.zeros(4, 8, 2), torch.tensor([0]), torch.ones(1, 8, 2), torch.tensor([5]), torch.ones(1, 2))
        kinds = [(c.kind, c.input_name, c.shape) for c in full_size_copies.find_full_size_copies(thunder.last_traces(jf)[-1])]
        assert kinds == [
            ("functional index_copy", "cache", (4, 8, 2)),
            ("copy_", "cache", (4, 8, 2)),
            ("functional index_put", "cache", (8, 2)),
            ("copy_", "cache", (8, 2)),
        ]

    def test_reads_and_clones_of_intermediates_are_not_flagged(self):
        import thunder

        def f(x, idx):
            y = x * 2
            z = y.clone()
            z[idx] = 0.0
            return x[idx].sum() + z.sum()

        jf = thunder.jit(f)
        jf(torch.ones(16, 4), torch.tensor([1]))
        assert full_size_copies.find_full_size_copies(thunder.last_traces(jf)[-1]) == []



class TestFindLargeTensors(TestCase):
    def test_views_of_split_are_not_large_tensors(self):
        # DeepSeek-V3's attention splits the expansion of its compressed cache; the pieces are views.
        import thunder

        def f(kv):
            k, v = torch.split(kv, [32, 32], -1)
            return k.sum() + v.sum()

        jf = thunder.jit(f)
        jf(torch.ones(1, 4, 256, 64))
        assert full_size_copies.find_large_tensors(thunder.last_traces(jf)[-1], 4 * 256 * 32) == []

    def test_a_clone_of_the_input_is_a_large_tensor_and_eager_counts_it_too(self):
        import thunder

        def f(cache):
            return cache.clone().mul_(2)

        cache = torch.ones(64, 64)
        jf = thunder.jit(f)
        jf(cache)
        found = full_size_copies.find_large_tensors(thunder.last_traces(jf)[-1], cache.numel())
        eager = full_size_copies.eager_large_tensors(f, cache, min_numel=cache.numel())
        assert len(found) >= 1 and [t.kind for t in eager] == ["clone"]
