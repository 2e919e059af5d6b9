"""Real clients: the report's model families, Qwen3 and gpt-oss (tiny, random weights, from a config),
decoding through a ``StaticCache`` under ThunderFX.

A decode step should move the rows it writes plus what attention reads: no tensor the size of a cache
made in the step, and no retrace of a Thunder segment per step.
"""

from __future__ import annotations

import pytest
import torch

from _support import full_size_copies, load_overlay_module, thunderfx

transformers = pytest.importorskip("transformers")
hf_models = load_overlay_module("benchmarks.inplace_writes.hf_models")

DECODE_STEPS = 5


def _thunder_traces(backend):
    import thunder

    return [thunder.last_traces(fn)[-1] for info in backend.subgraph_infos for fn in info.thunder_compiled_fns]


def _cpu_attention_reads_grouped_heads() -> bool:
    """Whether the grouped-query rewrite applies to attention on CPU (from torch 2.9; see 0023)."""
    try:
        from thunder.transforms.grouped_query_attention import CPU_ENABLE_GQA_IS_BITWISE
    except ImportError:  # stock Thunder (the A/B run): no rewrite, and the assertions show it
        return True
    return CPU_ENABLE_GQA_IS_BITWISE


@pytest.mark.claims_fix
def test_qwen3_decode_step_makes_no_cache_size_tensor():
    if not _cpu_attention_reads_grouped_heads():
        pytest.skip("torch < 2.9: attention on CPU keeps its repeated key/value heads (as on stock)")
    max_cache_len = 32768
    model, config = hf_models.tiny_decoder("qwen3", max_cache_len)
    expected = hf_models.greedy_decode(model, config, model, max_cache_len, DECODE_STEPS)

    compiled, backend = thunderfx(model, fullgraph=False)
    decode = hf_models.greedy_decode(model, config, compiled, max_cache_len, DECODE_STEPS - 1)
    measured = []  # the last step, under the peak-memory probe
    growth = full_size_copies.peak_memory_growth(lambda: measured.append(decode.step(compiled)))

    assert len(measured) == 1 and decode.tokens == expected.tokens
    cache_tensor = decode.cache.layers[0].keys
    large = [t for trace in _thunder_traces(backend) for t in full_size_copies.find_large_tensors(trace, cache_tensor.numel())]
    assert large == [], "\n".join(map(str, large))
    cache_bytes = cache_tensor.numel() * cache_tensor.element_size()
    assert growth < cache_bytes // 4, f"one decode step grew the peak memory by {growth / 2**20:.1f} MiB"


@pytest.mark.claims_fix
def test_gpt_oss_decode_traces_each_segment_once_and_makes_no_cache_size_tensor():
    import thunder

    max_cache_len, steps = 4096, 8
    model, config = hf_models.tiny_decoder("gpt_oss", max_cache_len)
    expected = hf_models.greedy_decode(model, config, model, max_cache_len, steps)

    # gpt-oss writes its attention out (matmuls around the sinks): the default ("sdpa", bitwise eager's) covers
    # scaled_dot_product_attention only; "fold" reads the grouped heads there too (last bits differ from eager).
    compiled, backend = thunderfx(model, fullgraph=False, grouped_query_attention="fold")
    decode = hf_models.greedy_decode(model, config, compiled, max_cache_len, steps)

    assert decode.tokens == expected.tokens
    # From the second step Dynamo passes the sliding-window layer's position as a SymInt; every Thunder
    # segment must be traced once, not once per step.
    stats = [thunder.compile_stats(fn) for info in backend.subgraph_infos for fn in info.thunder_compiled_fns]
    assert stats and all(s.cache_misses <= 1 for s in stats), [(s.cache_hits, s.cache_misses) for s in stats]
    assert sum(s.cache_hits for s in stats) > 0
    full_layer = max((layer.keys for layer in decode.cache.layers), key=lambda keys: keys.numel())
    large = [t for trace in _thunder_traces(backend) for t in full_size_copies.find_large_tensors(trace, full_layer.numel())]
    assert large == [], "\n".join(map(str, large))


def _segments(backend) -> list[tuple[int, int]]:
    """(Thunder segments, Inductor segments) of each Dynamo graph."""
    counts = []
    for info in backend.subgraph_infos:
        split = info.split_graph_module
        inductor = sum(1 for name, _ in split.named_children() if name.startswith("inductor")) if split is not None else 0
        counts.append((len(info.thunder_compiled_fns or []), inductor))
    return counts


# From a config, the parameters require grad, as from_pretrained leaves them; users decode under no_grad.
# mistral and gemma3 decode past their sliding window (the cache rolls every step).
@pytest.mark.claims_fix
@pytest.mark.parametrize(
    "family", ["mistral", pytest.param("gemma3", marks=pytest.mark.slow), "mixtral", "qwen3_moe", "deepseek_v3"]
)
def test_decode_is_one_thunder_segment_per_graph(family):
    import thunder

    max_cache_len, steps = 256, hf_models.SLIDING_WINDOW - hf_models.PROMPT_LEN + 3
    model, config = hf_models.tiny_decoder(family, max_cache_len, frozen=False)
    expected = hf_models.greedy_decode(model, config, model, max_cache_len, steps)
    full_layer = max((layer.keys for layer in expected.cache.layers), key=lambda keys: keys.numel())
    eager_large = full_size_copies.eager_large_tensors(expected.step, model, min_numel=full_layer.numel())

    compiled, backend = thunderfx(model, fullgraph=False)
    decode = hf_models.greedy_decode(model, config, compiled, max_cache_len, steps)

    assert decode.tokens == expected.tokens[: len(decode.tokens)]
    # Under no_grad the cache gets no autograd history (it did when Thunder counted writes under no_grad as
    #   differentiable: a grad_fn per step, and one more Dynamo graph for the changed requires_grad)
    assert not any(layer.keys.requires_grad or layer.values.requires_grad for layer in decode.cache.layers)
    reasons = [r.info for info in backend.subgraph_infos for r in (info.split_reasons or [])]
    assert _segments(backend) and all(c == (1, 0) for c in _segments(backend)), (_segments(backend), reasons)
    stats = [thunder.compile_stats(fn) for info in backend.subgraph_infos for fn in info.thunder_compiled_fns]
    assert all(s.cache_misses == 1 for s in stats), [(s.cache_hits, s.cache_misses) for s in stats]
    # A tensor of a cache's size that eager's step makes too (DeepSeek-V3's kv_b_proj expansion, the roll of a
    # full sliding window) is the model's own; each graph may make no more of them than eager's last step.
    if not _cpu_attention_reads_grouped_heads():
        return  # torch < 2.9: attention keeps its repeated key/value heads, a cache's size each (as on stock)
    for trace in full_size_copies.thunderfx_execution_traces(backend):
        large = full_size_copies.find_large_tensors(trace, full_layer.numel())
        assert len(large) <= len(eager_large), ("\n".join(map(str, large)), "\n".join(map(str, eager_large)))


# Uncompiled, Hugging Face's attention folds the query heads of a group into query rows for one query token
#   (pack_gqa); under a compiler it repeats the key/value heads instead, and Thunder's default rewrite keeps the
#   bits of that repeat (enable_gqa). grouped_query_attention="fold" makes Thunder's call the uncompiled one.
@pytest.mark.claims_fix
@pytest.mark.parametrize("family", ["llama", "qwen3_moe"])
def test_fold_decodes_with_the_logits_of_eager(family):
    max_cache_len, steps = 256, 3
    model, config = hf_models.tiny_decoder(family, max_cache_len, frozen=False)
    compiled, _ = thunderfx(model, fullgraph=False, grouped_query_attention="fold")
    eager = hf_models.Decode(model, config, max_cache_len).start()
    decode = hf_models.Decode(model, config, max_cache_len).start()
    for step in range(steps):
        expected, actual = eager.step(model).logits, decode.step(compiled).logits
        assert torch.equal(actual, expected), f"step {step}: {(actual - expected).abs().max()}"
