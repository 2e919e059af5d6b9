"""Tiny random-weight Hugging Face decoders of the families the KV-cache report measured, and greedy
decode through a ``StaticCache``: the real clients of the benchmark's decode workloads and of the tests.

Only ``torch`` and ``transformers`` are imported (lazily), so tests can load this file on a Thunder build
that lacks it. No download: the weights are random, from a config.

``llama``
    ``LlamaForCausalLM``, 2 layers, hidden 256, 4 query / 2 key-value heads.
``qwen3``
    ``Qwen3ForCausalLM`` (q/k norms), 2 layers, hidden 128, 4 query / 2 key-value heads of 64.
``gpt_oss``
    ``GptOssForCausalLM``: a sliding-window layer (window 64) and a full-attention layer, attention sinks,
    a 4-expert top-2 mixture of experts; 4 query / 2 key-value heads of 64.
``mistral``
    ``MistralForCausalLM`` with a sliding window of ``SLIDING_WINDOW`` tokens in every layer: decode past
    the window rolls the cache (``Tensor.roll``).
``gemma3``
    ``Gemma3ForCausalLM``: a sliding-window layer and a full-attention layer.
``mixtral``, ``qwen3_moe``
    4-expert top-2 mixtures of experts (``MixtralForCausalLM``, ``Qwen3MoeForCausalLM``).
``deepseek_v3``
    ``DeepseekV3ForCausalLM``: multi-head latent attention (a compressed cache expanded by ``kv_b_proj``
    every step), one dense and one 4-expert layer with a shared expert.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

__all__ = ["FAMILIES", "PROMPT_LEN", "Decode", "greedy_decode", "tiny_decoder"]

FAMILIES = ("llama", "qwen3", "gpt_oss", "mistral", "gemma3", "mixtral", "qwen3_moe", "deepseek_v3")
PROMPT_LEN = 8
SLIDING_WINDOW = 12  # mistral, gemma3: PROMPT_LEN + 4 decode steps fill it


def _config(family: str, max_cache_len: int):
    import transformers

    common = dict(
        vocab_size=1000,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max(max_cache_len, 4096),
    )
    if family == "llama":
        return transformers.LlamaConfig(hidden_size=256, intermediate_size=512, **common)
    if family == "qwen3":
        return transformers.Qwen3Config(hidden_size=128, intermediate_size=256, head_dim=64, **common)
    if family == "gpt_oss":
        return transformers.GptOssConfig(
            hidden_size=128,
            intermediate_size=128,
            head_dim=64,
            num_local_experts=4,
            num_experts_per_tok=2,
            sliding_window=64,
            layer_types=["sliding_attention", "full_attention"],
            **common,
        )
    small = dict(hidden_size=128, intermediate_size=256, head_dim=32)
    if family == "mistral":
        return transformers.MistralConfig(sliding_window=SLIDING_WINDOW, **small, **common)
    if family == "gemma3":
        return transformers.Gemma3TextConfig(
            sliding_window=SLIDING_WINDOW, layer_types=["sliding_attention", "full_attention"], **small, **common
        )
    if family == "mixtral":
        return transformers.MixtralConfig(num_local_experts=4, num_experts_per_tok=2, **small, **common)
    if family == "qwen3_moe":
        return transformers.Qwen3MoeConfig(
            moe_intermediate_size=64, num_experts=4, num_experts_per_tok=2, decoder_sparse_step=1, **small, **common
        )
    if family == "deepseek_v3":
        mla = dict(kv_lora_rank=32, q_lora_rank=64, qk_rope_head_dim=16, qk_nope_head_dim=32, v_head_dim=32)
        moe = dict(
            moe_intermediate_size=64,
            n_routed_experts=4,
            num_experts_per_tok=2,
            n_group=1,
            topk_group=1,
            n_shared_experts=1,
            first_k_dense_replace=1,
        )
        return transformers.DeepseekV3Config(
            hidden_size=128, intermediate_size=256, **mla, **moe, **{**common, "num_key_value_heads": 4}
        )
    raise ValueError(f"unknown family {family!r}; one of {FAMILIES}")


def tiny_decoder(family: str, max_cache_len: int, device: str | torch.device = "cpu", *, frozen: bool = True):
    """``(model, config)``: a tiny random-weight decoder of ``family`` (seeded), in eval mode, float32.

    ``frozen=False`` leaves the parameters as ``from_pretrained`` does (``requires_grad=True``): users decode
    under ``torch.no_grad()`` without freezing them."""
    import transformers

    config = _config(family, max_cache_len)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).to(device=device, dtype=torch.float32)
    return model.eval().requires_grad_(not frozen), config


@dataclass
class Decode:
    """A greedy decode: the tokens (the prefill's argmax first), the cache, and one step's inputs."""

    model: Any
    config: Any
    max_cache_len: int
    cache: Any = None
    tokens: list[int] | None = None

    def start(self) -> "Decode":
        """An eager prefill of ``PROMPT_LEN`` tokens into a fresh ``StaticCache``."""
        import transformers

        device = next(self.model.parameters()).device
        self.cache = transformers.StaticCache(config=self.config, max_cache_len=self.max_cache_len)
        prompt = torch.randint(0, self.config.vocab_size, (1, PROMPT_LEN), generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            logits = self.model(
                input_ids=prompt.to(device),
                past_key_values=self.cache,
                use_cache=True,
                cache_position=torch.arange(PROMPT_LEN, device=device),
            ).logits
        self.tokens = [int(logits[0, -1].argmax())]
        return self

    def step_inputs(self) -> dict:
        device = next(self.model.parameters()).device
        position = torch.tensor([PROMPT_LEN + len(self.tokens) - 1], device=device)
        return dict(
            input_ids=torch.tensor([[self.tokens[-1]]], device=device),
            past_key_values=self.cache,
            cache_position=position,
            position_ids=position.unsqueeze(0),
            use_cache=True,
        )

    def step(self, forward: Callable) -> Any:
        """One decode step through ``forward``; appends its greedy token. Returns the model output."""
        with torch.no_grad():
            out = forward(**self.step_inputs())
        self.tokens.append(int(out.logits[0, -1].argmax()))
        return out


def greedy_decode(model, config, forward: Callable, max_cache_len: int, steps: int) -> Decode:
    """Eager prefill, then ``steps`` greedy decode steps through ``forward``."""
    decode = Decode(model, config, max_cache_len).start()
    for _ in range(steps):
        decode.step(forward)
    return decode
