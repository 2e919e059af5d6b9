"""Attention over repeated key/value heads runs on the grouped heads: no copy of the key/value tensors.

See thunder/transforms/grouped_query_attention.py. Each case is a decode- or prefill-shaped attention
over a key/value "cache" whose heads are repeated the way models do it; the result must match eager, the
execution trace must make no tensor as large as the cache, and one call must not grow the peak memory by
anything near the cache's size.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import thunder
from thunder.examine.full_size_copies import find_large_tensors, peak_memory_growth


def _repeat_kv(hidden_states, n_rep):
    # Hugging Face's repeat_kv (transformers/integrations/sdpa_attention.py), the form its models trace to
    # under a compiler.
    batch, kv_heads, length, head_dim = hidden_states.shape
    hidden_states = hidden_states[:, :, None, :, :].expand(batch, kv_heads, n_rep, length, head_dim)
    return hidden_states.reshape(batch, kv_heads * n_rep, length, head_dim)


def _hf_attention(q, k, v, mask):
    n_rep = q.shape[1] // k.shape[1]
    return F.scaled_dot_product_attention(q, _repeat_kv(k, n_rep), _repeat_kv(v, n_rep), attn_mask=mask, scale=0.125)


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


@pytest.mark.parametrize("mask_kind", ["none", "bool_shared", "float_per_head", "float_2d"])
@pytest.mark.parametrize("q_len", [1, 5], ids=["decode", "prefill"])
@pytest.mark.parametrize("form", sorted(_ATTENTIONS))
def test_attention_over_repeated_kv_heads_makes_no_cache_size_tensor(form, q_len, mask_kind):
    attention = _ATTENTIONS[form]
    q, k, v, mask = _inputs(2, 8, 2, q_len, 512, mask_kind)
    if attention is _written_out_attention and mask is not None and mask.dtype == torch.bool:
        mask = torch.zeros(mask.shape).masked_fill(~mask, float("-inf"))
    jitted = thunder.jit(attention)
    torch.testing.assert_close(jitted(q, k, v, mask), attention(q, k, v, mask))
    assert find_large_tensors(thunder.last_traces(jitted)[-1], k.numel()) == []


def test_multi_query_attention_reads_the_single_head():
    # Kept behaviour, not the fix: a broadcast of one key/value head (no reshape) was never copied, on
    # stock either; the pass rewrites it too and must keep the values and the absence of copies.
    q, k, v, mask = _inputs(1, 4, 1, 1, 512, "bool_shared")
    jitted = thunder.jit(_multi_query_attention)
    torch.testing.assert_close(jitted(q, k, v, mask), _multi_query_attention(q, k, v, mask))
    assert find_large_tensors(thunder.last_traces(jitted)[-1], k.numel()) == []


def test_decode_attention_peak_memory_is_far_below_the_cache():
    # 4 query heads over 2 key/value heads of 64 MiB each: the repeat copied 2 x 128 MiB per call.
    q, k, v, mask = _inputs(1, 4, 2, 1, 131072, "bool_shared")
    jitted = thunder.jit(_hf_attention)
    expected = _hf_attention(q, k, v, mask)
    torch.testing.assert_close(jitted(q, k, v, mask), expected)
    growth = peak_memory_growth(jitted, q, k, v, mask)
    assert growth < k.numel() * k.element_size() // 4, f"one call grew the peak memory by {growth >> 20} MiB"


def test_decode_tokens_match_eager_in_bfloat16():
    # The folded form runs the same per-head softmax rows; in bfloat16 it must pick eager's argmax.
    q, k, v, mask = _inputs(1, 8, 2, 1, 2048, "bool_shared", dtype=torch.bfloat16)
    jitted = thunder.jit(_hf_attention)
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
    # rewrite must leave it alone (mask=None is required with is_causal).
    def attention(q, k, v):
        n_rep = q.shape[1] // k.shape[1]
        return F.scaled_dot_product_attention(q, _repeat_kv(k, n_rep), _repeat_kv(v, n_rep), **kwargs)

    q, k, v, _ = _inputs(1, 4, 2, 6, 6, "none")
    torch.testing.assert_close(thunder.jit(attention)(q, k, v), attention(q, k, v))


def test_gradients_flow_to_the_grouped_key_and_value():
    def make():
        q, k, v, mask = _inputs(1, 4, 2, 3, 16, "float_per_head")
        return [t.requires_grad_() for t in (q, k, v)], mask

    (q, k, v), mask = make()
    (qe, ke, ve), _ = make()
    out = thunder.jit(_hf_attention)(q, k, v, mask)
    expected = _hf_attention(qe, ke, ve, mask)
    torch.testing.assert_close(out, expected)
    grad = torch.randn_like(out)
    out.backward(grad)
    expected.backward(grad)
    for actual_tensor, expected_tensor in ((q, qe), (k, ke), (v, ve)):
        torch.testing.assert_close(actual_tensor.grad, expected_tensor.grad)
