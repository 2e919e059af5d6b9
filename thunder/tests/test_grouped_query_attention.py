"""Attention over repeated key/value heads runs on the grouped heads: no copy of the key/value tensors.

See thunder/transforms/grouped_query_attention.py. Each case is a decode- or prefill-shaped attention
over a key/value "cache" whose heads are repeated the way models do it; where the rewrite applies the
execution trace must make no tensor as large as the cache, and one call must not grow the peak memory by
anything near the cache's size; where it does not, the attention must be left as it is.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import thunder
from thunder.examine.full_size_copies import find_large_tensors, peak_memory_growth

from thunder.transforms.grouped_query_attention import CPU_ENABLE_GQA_IS_BITWISE

FOLD = {"grouped_query_attention": "fold"}
# Before torch 2.9 attention through scaled_dot_product_attention on CPU is left as it is (its enable_gqa
#   kernel gives other bits there): the tests that look for the rewrite of it run from 2.9 on.
needs_cpu_enable_gqa = pytest.mark.skipif(
    not CPU_ENABLE_GQA_IS_BITWISE, reason="scaled_dot_product_attention on CPU is rewritten from torch 2.9 on"
)


def _repeat_kv(hidden_states, n_rep):
    # Hugging Face's repeat_kv (transformers/integrations/sdpa_attention.py), the form its models trace to
    # under a compiler.
    batch, kv_heads, length, head_dim = hidden_states.shape
    hidden_states = hidden_states[:, :, None, :, :].expand(batch, kv_heads, n_rep, length, head_dim)
    return hidden_states.reshape(batch, kv_heads * n_rep, length, head_dim)


def _hf_attention(q, k, v, mask, is_causal=False):
    n_rep = q.shape[1] // k.shape[1]
    return F.scaled_dot_product_attention(
        q, _repeat_kv(k, n_rep), _repeat_kv(v, n_rep), attn_mask=mask, is_causal=is_causal, scale=0.125
    )


def _litgpt_attention(q, k, v, mask):
    # litgpt and gpt-fast: repeat_interleave along the head dim.
    n_rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(n_rep, dim=1), v.repeat_interleave(n_rep, dim=1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def _multi_query_attention(q, k, v, mask):
    # One key/value head, broadcast to every query head without a reshape.
    heads = q.shape[1]
    k, v = k.expand(-1, heads, -1, -1), v.expand(-1, heads, -1, -1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def _inputs(batch, heads, kv_heads, q_len, length, mask_kind, dtype=torch.float32, head_dim=64):
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(batch, heads, q_len, head_dim, generator=generator, dtype=dtype)
    k = torch.randn(batch, kv_heads, length, head_dim, generator=generator, dtype=dtype)
    v = torch.randn(batch, kv_heads, length, head_dim, generator=generator, dtype=dtype)
    mask = {
        "none": None,
        "bool_shared": torch.rand(batch, 1, q_len, length, generator=generator) < 0.9,
        "float_per_head": torch.randn(batch, heads, q_len, length, generator=generator, dtype=dtype),
        "float_2d": torch.randn(q_len, length, generator=generator, dtype=dtype),
        "key_padding": torch.rand(batch, 1, 1, length, generator=generator) < 0.9,
    }[mask_kind]
    return q, k, v, mask


def _written_out_attention(q, k, v, mask):
    # Attention as two matmuls over repeated heads, as gpt-oss writes it (with attention sinks) and
    # Hugging Face's eager attention.
    n_rep = q.shape[1] // k.shape[1]
    key_states, value_states = _repeat_kv(k, n_rep), _repeat_kv(v, n_rep)
    weights = torch.matmul(q, key_states.transpose(2, 3)) * 0.125
    if mask is not None:  # additive, as Hugging Face's eager attention gets it
        weights = weights + mask
    sinks = torch.zeros(1, q.shape[1], 1, 1).expand(q.shape[0], -1, q.shape[2], -1)
    probs = torch.softmax(torch.cat([weights, sinks], dim=-1), dim=-1)[..., :-1]
    return torch.matmul(probs, value_states)


_ATTENTIONS = {
    "hf_repeat_kv": _hf_attention,
    "repeat_interleave": _litgpt_attention,
    "matmuls_with_sinks": _written_out_attention,
}


def _repeats(trace):
    return [b for b in trace.bound_symbols if b.sym.name in ("reshape", "repeat_interleave", "expand")]


@pytest.mark.parametrize("mask_kind", ["none", "key_padding"])
@pytest.mark.parametrize("q_len", [1, 5], ids=["decode", "prefill"])
@pytest.mark.parametrize("form", sorted(_ATTENTIONS))
def test_fold_makes_no_cache_size_tensor(form, q_len, mask_kind):
    attention = _ATTENTIONS[form]
    q, k, v, mask = _inputs(2, 8, 2, q_len, 512, mask_kind)
    if attention is _written_out_attention and mask is not None:
        mask = torch.zeros(mask.shape).masked_fill(~mask, float("-inf"))
    jitted = thunder.jit(attention, **FOLD)
    torch.testing.assert_close(jitted(q, k, v, mask), attention(q, k, v, mask))
    assert find_large_tensors(thunder.last_traces(jitted)[-1], k.numel()) == []


def _hf_eager_decode_attention(q, k, v, mask):
    # What Hugging Face's sdpa attention runs for one query token when it is not compiled (pack_gqa): the
    # query heads of a group as query rows, a mask shared by the heads as it is.
    batch, heads, _, head_dim = q.shape
    folded = q.reshape(batch, k.shape[1], heads // k.shape[1], head_dim)
    return F.scaled_dot_product_attention(folded, k, v, attn_mask=mask, scale=0.125).reshape(q.shape)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("mask_kind", ["none", "key_padding"])
@pytest.mark.parametrize("form", ["hf_repeat_kv", "repeat_interleave"])
def test_fold_attends_a_decode_step_as_eager_hugging_face_code(form, mask_kind, dtype):
    # Under a compiler Hugging Face code repeats the heads (the traced program); uncompiled it folds them. The
    # fold makes Thunder's call the uncompiled one, on CPU too: the model's eager bits, each key/value head
    # read once (enable_gqa reads it once per query head of its group).
    q, k, v, mask = _inputs(2, 8, 2, 1, 300, mask_kind, dtype=dtype)
    jitted = thunder.jit(_ATTENTIONS[form], **FOLD)
    assert torch.equal(jitted(q, k, v, mask), _hf_eager_decode_attention(q, k, v, mask))
    trace = thunder.last_traces(jitted)[-1]
    (attention,) = [b for b in trace.bound_symbols if "scaled_dot" in b.sym.name]
    assert [tuple(t.shape) for t in attention.args[:3]] == [(2, 2, 4, 64), tuple(k.shape), tuple(v.shape)]
    assert find_large_tensors(trace, k.numel()) == []


@pytest.mark.parametrize("mask_kind", ["bool_shared", "float_per_head", "float_2d"])
def test_fold_leaves_attention_with_a_mask_per_row_or_head_alone(mask_kind):
    # Folding would need the mask repeated n_rep times (per row) or regrouped (per head): more memory than
    # the repeats it removes once the query is longer than twice the head dim. Such attention keeps its repeats.
    q, k, v, mask = _inputs(1, 8, 2, 64, 64, mask_kind, head_dim=8)
    jitted = thunder.jit(_hf_attention, **FOLD)
    assert torch.equal(jitted(q, k, v, mask), _hf_attention(q, k, v, mask))
    assert find_large_tensors(thunder.last_traces(jitted)[-1], 2 * mask.numel()) == []


@pytest.mark.parametrize("options", [{}, FOLD], ids=["default", "fold"])
def test_prefill_with_a_mask_grows_the_peak_memory_no_more_than_the_repeats(options):
    # A 2,048-token prefill over a float mask shared by the heads (16 MiB); the repeats are 1 MiB each.
    q, k, v, _ = _inputs(1, 8, 2, 2048, 2048, "none", head_dim=16)
    mask = torch.zeros(1, 1, 2048, 2048).masked_fill(torch.rand(1, 1, 2048, 2048) < 0.1, float("-inf"))
    on = thunder.jit(_hf_attention, **options)
    expected = _hf_attention(q, k, v, mask)
    torch.testing.assert_close(on(q, k, v, mask), expected)
    # Eager repeats the keys and values, as stock Thunder does.
    growth_eager = peak_memory_growth(_hf_attention, q, k, v, mask)
    growth_on = peak_memory_growth(on, q, k, v, mask)
    assert growth_on <= growth_eager + (8 << 20), f"{growth_on >> 20} MiB on, {growth_eager >> 20} MiB eager"


@pytest.mark.parametrize("options", [{}, FOLD], ids=["default", "fold"])
def test_symbolic_values_trace_takes_its_sizes_from_the_proxies(options):
    # One trace serves every size under cache="symbolic values": nothing in it may be an int baked at trace time.
    def attention(q, k, v):
        return F.scaled_dot_product_attention(q, _repeat_kv(k, 2), _repeat_kv(v, 2))

    jitted = thunder.jit(attention, cache="symbolic values", **options)
    for batch, q_len in ((2, 1), (1, 2), (1, 3), (3, 1)):
        q, k, v, _ = _inputs(batch, 4, 2, q_len, 5, "none", head_dim=8)
        actual, expected = jitted(q, k, v), attention(q, k, v)
        assert actual.shape == expected.shape
        torch.testing.assert_close(actual, expected)


_SDPA_FORMS = {"hf_repeat_kv": 2, "repeat_interleave": 2, "multi_query": 1}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("mask_kind", ["none", "causal", "bool_shared", "float_per_head", "float_2d", "key_padding"])
@pytest.mark.parametrize("q_len", [1, 37], ids=["decode", "prefill"])
@pytest.mark.parametrize("form", sorted(_SDPA_FORMS))
def test_default_reads_the_grouped_heads_bitwise_as_eager(form, q_len, mask_kind, dtype):
    # enable_gqa=True on CPU: every mask and is_causal as they are, and eager's bits.
    attention = {"hf_repeat_kv": _hf_attention, "repeat_interleave": _litgpt_attention}.get(
        form, _multi_query_attention
    )
    kwargs = {"is_causal": True} if mask_kind == "causal" else {}
    q, k, v, mask = _inputs(2, 8, _SDPA_FORMS[form], q_len, 300, "none" if kwargs else mask_kind, dtype=dtype)
    if kwargs:
        q = q[:, :, :1] if q_len == 1 else q
        k, v = k[:, :, :q_len], v[:, :, :q_len]  # is_causal aligns the square top-left

        def attention(q, k, v, mask, attention=attention):
            return _hf_attention(q, k, v, mask, **kwargs) if attention is _hf_attention else attention(q, k, v, mask)

    jitted = thunder.jit(attention)
    assert torch.equal(jitted(q, k, v, mask), attention(q, k, v, mask))
    if not CPU_ENABLE_GQA_IS_BITWISE:
        return  # left as it is: the repeats stay (eager's bits, checked above)
    trace = thunder.last_traces(jitted)[-1]
    assert _repeats(trace) == []
    if attention is not _multi_query_attention:
        assert any(b.kwargs.get("enable_gqa") for b in trace.bound_symbols if "scaled_dot" in b.sym.name)


def test_grouped_query_attention_option():
    q, k, v, mask = _inputs(1, 4, 2, 1, 64, "none")
    with pytest.raises(ValueError, match="grouped_query_attention"):
        thunder.jit(_hf_attention, grouped_query_attention="sometimes")(q, k, v, mask)
    for off in ("off", False):
        jitted = thunder.jit(_hf_attention, grouped_query_attention=off)
        assert torch.equal(jitted(q, k, v, mask), _hf_attention(q, k, v, mask))
        assert len(_repeats(thunder.last_traces(jitted)[-1])) >= 2
    # The pass as a user transform (after the alias pass).
    from thunder.transforms import GroupedQueryAttentionTransform

    jitted = thunder.jit(_hf_attention, transforms=[GroupedQueryAttentionTransform()])
    torch.testing.assert_close(jitted(q, k, v, mask), _hf_attention(q, k, v, mask))
    if CPU_ENABLE_GQA_IS_BITWISE:
        assert find_large_tensors(thunder.last_traces(jitted)[-1], k.numel()) == []


def test_multi_query_attention_reads_the_single_head():
    # Kept behaviour, not the fix: a broadcast of one key/value head (no reshape) was never copied, on
    # stock either; the pass rewrites it too and must keep the values and the absence of copies.
    q, k, v, mask = _inputs(1, 4, 1, 1, 512, "key_padding")
    jitted = thunder.jit(_multi_query_attention, **FOLD)
    torch.testing.assert_close(jitted(q, k, v, mask), _multi_query_attention(q, k, v, mask))
    assert find_large_tensors(thunder.last_traces(jitted)[-1], k.numel()) == []


@needs_cpu_enable_gqa
@pytest.mark.parametrize("options", [{}, FOLD], ids=["default", "fold"])
def test_decode_attention_peak_memory_is_far_below_the_cache(options):
    # 4 query heads over 2 key/value heads of 64 MiB each: the repeat copied 2 x 128 MiB per call.
    q, k, v, mask = _inputs(1, 4, 2, 1, 131072, "key_padding")
    jitted = thunder.jit(_hf_attention, **options)
    expected = _hf_attention(q, k, v, mask)
    torch.testing.assert_close(jitted(q, k, v, mask), expected)
    growth = peak_memory_growth(jitted, q, k, v, mask)
    assert growth < k.numel() * k.element_size() // 4, f"one call grew the peak memory by {growth >> 20} MiB"


def test_decode_tokens_match_eager_in_bfloat16():
    # The folded form runs the same per-head softmax rows; in bfloat16 it must pick eager's argmax.
    q, k, v, mask = _inputs(1, 8, 2, 1, 2048, "key_padding", dtype=torch.bfloat16)
    jitted = thunder.jit(_hf_attention, **FOLD)
    actual, expected = jitted(q, k, v, mask), _hf_attention(q, k, v, mask)
    torch.testing.assert_close(actual, expected)
    assert torch.equal(actual.float().argmax(-1), expected.float().argmax(-1))


@pytest.mark.parametrize(
    "kwargs",
    [{"is_causal": True}, {"dropout_p": 0.0, "is_causal": False, "scale": None}],
    ids=["causal", "defaults"],
)
def test_forms_left_alone_or_rewritten_still_match_eager(kwargs):
    # is_causal aligns its mask to each head's rows; folding heads into rows would shift it, so the
    # fold must leave it alone (mask=None is required with is_causal).
    def attention(q, k, v):
        n_rep = q.shape[1] // k.shape[1]
        return F.scaled_dot_product_attention(q, _repeat_kv(k, n_rep), _repeat_kv(v, n_rep), **kwargs)

    q, k, v, _ = _inputs(1, 4, 2, 6, 6, "none")
    torch.testing.assert_close(thunder.jit(attention, **FOLD)(q, k, v), attention(q, k, v))


@pytest.mark.parametrize("options", [{}, FOLD], ids=["default", "fold"])
def test_gradients_flow_to_the_grouped_key_and_value(options):
    def make():
        q, k, v, mask = _inputs(1, 4, 2, 3, 16, "key_padding")
        return [t.requires_grad_() for t in (q, k, v)], mask

    (q, k, v), mask = make()
    (qe, ke, ve), _ = make()
    out = thunder.jit(_hf_attention, **options)(q, k, v, mask)
    expected = _hf_attention(qe, ke, ve, mask)
    torch.testing.assert_close(out, expected)
    grad = torch.randn_like(out)
    out.backward(grad)
    expected.backward(grad)
    for actual_tensor, expected_tensor in ((q, qe), (k, ke), (v, ve)):
        torch.testing.assert_close(actual_tensor.grad, expected_tensor.grad)
