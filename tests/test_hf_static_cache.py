"""A real client: Hugging Face LlamaForCausalLM decoding with StaticCache under ThunderFX.

StaticCache writes the cache with `keys.index_copy_(2, cache_position, k)`. With the native fix the
decode step stays one Thunder graph and no trace copies a whole cache tensor.
"""

from __future__ import annotations

import pytest
import torch

from _support import full_copies_in, split_reason_types, thunderfx

transformers = pytest.importorskip("transformers")

MAX_CACHE_LEN = 256
PREFILL = 8
DECODE_STEPS = 6


def _tiny_llama():
    config = transformers.LlamaConfig(
        vocab_size=1000,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=MAX_CACHE_LEN,
    )
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval(), config


def _greedy_decode(model, config, forward):
    """Eager prefill, then DECODE_STEPS greedy steps through `forward`. Returns tokens and the cache."""
    cache = transformers.StaticCache(config=config, max_cache_len=MAX_CACHE_LEN)
    prompt = torch.arange(1, PREFILL + 1).unsqueeze(0)
    with torch.no_grad():
        logits = model(input_ids=prompt, past_key_values=cache, use_cache=True).logits
        tokens = [int(logits[0, -1].argmax())]
        for step in range(DECODE_STEPS):
            position = torch.tensor([PREFILL + step])
            logits = forward(
                input_ids=torch.tensor([[tokens[-1]]]),
                past_key_values=cache,
                cache_position=position,
                position_ids=position.unsqueeze(0),
                use_cache=True,
            ).logits
            tokens.append(int(logits[0, -1].argmax()))
    return tokens, cache


@pytest.mark.claims_fix
def test_static_cache_decode_is_one_thunder_graph_without_full_copies():
    model, config = _tiny_llama()
    expected_tokens, expected_cache = _greedy_decode(model, config, model)

    compiled, backend = thunderfx(model, fullgraph=False)
    tokens, cache = _greedy_decode(model, config, compiled)

    assert tokens == expected_tokens
    written = PREFILL + DECODE_STEPS
    for layer, expected_layer in zip(cache.layers, expected_cache.layers):
        for got, want in ((layer.keys, expected_layer.keys), (layer.values, expected_layer.values)):
            # Prefill rows (written eagerly) and rows never written are bitwise eager's; the rows the
            # compiled decode wrote hold Thunder's K/V projections, equal to eager's up to rounding.
            assert torch.equal(got[:, :, :PREFILL], want[:, :, :PREFILL])
            assert torch.equal(got[:, :, written:], want[:, :, written:])
            torch.testing.assert_close(got[:, :, PREFILL:written], want[:, :, PREFILL:written])
            assert got[:, :, PREFILL:written].abs().sum() > 0, "decode steps wrote nothing into the cache"
    assert full_copies_in(backend) == [], "a Thunder trace copies a whole cache tensor"
    assert split_reason_types(backend) == []
    segments = [len(info.submodule_to_compiled_functions) for info in backend.subgraph_infos]
    assert segments == [1] * len(segments) and len(backend.subgraph_infos) >= 1
