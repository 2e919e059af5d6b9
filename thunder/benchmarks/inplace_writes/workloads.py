"""The workloads: what is compiled, the inputs of each call, and the check against eager.

A :class:`Case` is one workload at one size. :func:`measure.measure` drives it: ``fresh()`` gives each
backend its own copy of the starting state, ``call(fn, state, i)`` is the timed call ``i``,
``after_call`` does the untimed bookkeeping, ``check(state)`` compares with eager after ``check_after``
calls (and again after the timed calls if ``check_again_at_end``).
"""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING, Any

import torch

from .measure import RepConfig, log

if TYPE_CHECKING:
    from collections.abc import Callable


def _rss_gib() -> float:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**30
    except OSError:
        return float("nan")


def tiled(shape, dtype, device, gen, tile_rows=4096) -> torch.Tensor:
    """A tensor of ``shape`` filled with a tiled random block: random-looking, cheap for GB-sized buffers."""
    n = shape[0]
    rows = min(n, tile_rows)
    block = torch.randn((rows, *shape[1:]), generator=gen, dtype=torch.float32).to(dtype=dtype, device=device)
    out = torch.empty(shape, dtype=dtype, device=device)
    for start in range(0, n, rows):
        stop = min(n, start + rows)
        out[start:stop] = block[: stop - start]
    return out


class Case:
    workload: str
    check_after = 1  # calls before the check (the first one compiles)
    check_again_at_end = False
    no_grad = True  # run the calls under torch.no_grad()
    # torch.compile's `dynamic`. False for the plain functions (each size compiles once); the HF decoders
    # leave it to Dynamo (None), as their users do: gpt-oss's sliding-window counter is a Python int that
    # changes every step, which dynamic=False recompiles per step until Dynamo's cache limit.
    dynamic: bool | None = False
    size: int
    size_note: str
    fn: Callable  # what each backend compiles

    def fresh(self) -> Any:
        raise NotImplementedError

    def call(self, fn: Callable, state: Any, i: int) -> Any:
        raise NotImplementedError

    def after_call(self, state: Any, i: int, out: Any) -> None:
        pass

    def check(self, state: Any) -> tuple[bool, str]:
        raise NotImplementedError


# ----------------------------------------------------------------------------------------------------
# (a) the reported graph
# ----------------------------------------------------------------------------------------------------


def write(k_buffer, loc, k):
    k_buffer[loc] = k


class Setitem(Case):
    """``write(k_buffer, loc, k)`` on a bf16 ``[N, 8, 64]`` buffer; the same row every call."""

    workload = "setitem"
    check_again_at_end = True
    no_grad = False

    def __init__(self, n: int, device: torch.device, max_steps: int):
        gen = torch.Generator().manual_seed(n)
        self.size, self.fn = n, write
        self.ref = tiled((n, 8, 64), torch.bfloat16, device, gen)
        self.loc = torch.tensor([n // 2 + 3], dtype=torch.int64, device=device)
        self.k = torch.randn((1, 8, 64), generator=gen).to(dtype=torch.bfloat16, device=device)
        self.saved = self.ref[self.loc].clone()
        write(self.ref, self.loc, self.k)  # eager reference result
        self.size_note = f"{n * 8 * 64 * 2 / 2**20:,.0f} MiB buffer"

    def fresh(self):
        buf = self.ref.clone()
        buf[self.loc] = self.saved
        return buf

    def call(self, fn, buf, i):
        return fn(buf, self.loc, self.k)

    def check(self, buf):
        ok = torch.equal(buf, self.ref)
        return ok, "bitwise equal" if ok else "buffer differs from eager"


# ----------------------------------------------------------------------------------------------------
# (b) and (d): a small decoder with a token-pool (or gpt-fast-style) KV cache
# ----------------------------------------------------------------------------------------------------


class RMSNorm(torch.nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class DecoderLayer(torch.nn.Module):
    def __init__(self, hidden, n_heads, n_kv_heads, head_dim, intermediate):
        super().__init__()
        self.attn_norm = RMSNorm(hidden)
        self.wq = torch.nn.Linear(hidden, n_heads * head_dim, bias=False)
        self.wk = torch.nn.Linear(hidden, n_kv_heads * head_dim, bias=False)
        self.wv = torch.nn.Linear(hidden, n_kv_heads * head_dim, bias=False)
        self.wo = torch.nn.Linear(n_heads * head_dim, hidden, bias=False)
        self.mlp_norm = RMSNorm(hidden)
        self.w1 = torch.nn.Linear(hidden, intermediate, bias=False)
        self.w3 = torch.nn.Linear(hidden, intermediate, bias=False)
        self.w2 = torch.nn.Linear(intermediate, hidden, bias=False)


def _rope(x, cos, sin):
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class PoolDecoder(torch.nn.Module):
    """Llama-style decoder, batch 1, one token per step. ``layout="token_pool"``: per-layer caches
    ``[N, kv_heads, head_dim]`` written with ``k_buffer[layer][loc] = k`` (SGLang's token pool);
    ``layout="gpt_fast"``: ``[1, kv_heads, N, head_dim]`` written with ``k_cache[:, :, loc] = k``.
    Attention reads only the request's slots ``req_slots``, gathered from the cache after the write."""

    def __init__(
        self,
        layout="token_pool",
        vocab=1000,
        hidden=512,
        n_layers=4,
        n_heads=8,
        n_kv_heads=2,
        head_dim=64,
        intermediate=1408,
    ):
        super().__init__()
        self.layout = layout
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, head_dim
        self.embed = torch.nn.Embedding(vocab, hidden)
        self.layers = torch.nn.ModuleList(
            DecoderLayer(hidden, n_heads, n_kv_heads, head_dim, intermediate) for _ in range(n_layers)
        )
        self.norm = RMSNorm(hidden)
        self.lm_head = torch.nn.Linear(hidden, vocab, bias=False)
        self.register_buffer(
            "inv_freq", 1.0 / (10000.0 ** (torch.arange(0, head_dim, 2).float() / head_dim)), persistent=False
        )

    def forward(self, token, pos, k_buffer: list, v_buffer: list, loc, req_slots):
        H, KV, D = self.n_heads, self.n_kv_heads, self.head_dim
        x = self.embed(token)  # [1, hidden]
        freqs = pos.to(torch.float32)[:, None] * self.inv_freq[None, :]  # [1, D/2]
        cos, sin = freqs.cos()[:, None, :], freqs.sin()[:, None, :]  # [1, 1, D/2]
        for i, layer in enumerate(self.layers):
            h = layer.attn_norm(x)
            q = _rope(layer.wq(h).view(1, H, D), cos, sin)
            k = _rope(layer.wk(h).view(1, KV, D), cos, sin)
            v = layer.wv(h).view(1, KV, D)
            if self.layout == "token_pool":
                k_buffer[i][loc] = k
                v_buffer[i][loc] = v
                ks = k_buffer[i][req_slots].transpose(0, 1)  # [KV, L, D]
                vs = v_buffer[i][req_slots].transpose(0, 1)
            else:
                k_buffer[i][:, :, loc] = k.view(1, KV, 1, D)
                v_buffer[i][:, :, loc] = v.view(1, KV, 1, D)
                ks = k_buffer[i][:, :, req_slots][0]  # [KV, L, D]
                vs = v_buffer[i][:, :, req_slots][0]
            qg = q.view(KV, H // KV, D)
            scores = torch.matmul(qg, ks.transpose(-1, -2)) * (D**-0.5)  # [KV, G, L]
            probs = torch.softmax(scores, dim=-1)
            o = torch.matmul(probs, vs).reshape(1, H * D)
            x = x + layer.wo(o)
            h = layer.mlp_norm(x)
            x = x + layer.w2(torch.nn.functional.silu(layer.w1(h)) * layer.w3(h))
        return self.lm_head(self.norm(x))


POOL_CONTEXT = 1000  # positions already in the cache before the first measured step
POOL_WINDOW = 128  # slots each step attends over


@dataclasses.dataclass
class PoolState:
    k: list[torch.Tensor]
    v: list[torch.Tensor]
    logits: list[torch.Tensor]


class TokenPool(Case):
    """One decode step of :class:`PoolDecoder` per call, each at the next position of a request whose
    positions live at random slots of the cache. Checked after 3 steps (the first compiles, the later
    ones read what it wrote): cache and logits against eager."""

    workload = layout = "token_pool"
    check_after = 3

    def __init__(self, n: int, device: torch.device, max_steps: int):
        torch.manual_seed(0)
        self.size = n
        self.fn = model = PoolDecoder(layout=self.layout).to(device).eval().requires_grad_(False)
        L, KV, D = len(model.layers), model.n_kv_heads, model.head_dim
        gen = torch.Generator().manual_seed(n + 1)
        slot_of_pos = torch.randperm(n, generator=gen)[: POOL_CONTEXT + max_steps].to(device)
        tokens = torch.randint(0, 1000, (max_steps, 1), generator=gen).to(device)

        def step_inputs(t):
            p = POOL_CONTEXT + t
            # Separate tensors, not views of one: Thunder rejects inputs that alias each other with
            # different shapes (insert_alias_updates tries to reshape one into the other).
            return (
                tokens[t].clone(),
                torch.tensor([p], device=device),
                slot_of_pos[p : p + 1].clone(),
                slot_of_pos[p - POOL_WINDOW + 1 : p + 1].clone(),
            )

        self.inputs = [step_inputs(t) for t in range(max_steps)]
        self.slot_dim = 0 if self.layout == "token_pool" else 2

        def make_cache():
            if self.layout == "token_pool":
                return [tiled((n, KV, D), torch.float32, device, gen) for _ in range(L)]
            return [tiled((n, KV, D), torch.float32, device, gen).permute(1, 0, 2).contiguous()[None] for _ in range(L)]

        self.ref_k, self.ref_v = make_cache(), make_cache()
        self.written = slot_of_pos[POOL_CONTEXT : POOL_CONTEXT + self.check_after]
        self.saved_k = [b.index_select(self.slot_dim, self.written) for b in self.ref_k]
        self.saved_v = [b.index_select(self.slot_dim, self.written) for b in self.ref_v]
        with torch.no_grad():
            self.ref_logits = [
                model(*self.inputs[t][:2], self.ref_k, self.ref_v, *self.inputs[t][2:]) for t in range(self.check_after)
            ]
        pool_bytes = 2 * L * n * KV * D * 4
        self.size_note = f"{pool_bytes / 2**30:.2f} GiB k+v cache ({L} layers)"
        log(f"  [{self.workload} N={n:,}] cache {self.size_note}; process RSS {_rss_gib():.1f} GiB")

    def fresh(self):
        def restore(ref, saved):
            out = [b.clone() for b in ref]
            for b, s in zip(out, saved):
                b.index_copy_(self.slot_dim, self.written, s)
            return out

        return PoolState(restore(self.ref_k, self.saved_k), restore(self.ref_v, self.saved_v), [])

    def call(self, fn, s: PoolState, i):
        tok, pos, loc, req = self.inputs[i]
        return fn(tok, pos, s.k, s.v, loc, req)

    def after_call(self, s: PoolState, i, out):
        if i < self.check_after:
            s.logits.append(out)

    def _compare(self, bufs, refs) -> tuple[bool, float]:
        """(untouched slots bitwise equal, max |diff| over the written slots)."""
        untouched_ok, max_diff = True, 0.0
        for b, r in zip(bufs, refs):
            got = b.index_select(self.slot_dim, self.written)
            want = r.index_select(self.slot_dim, self.written)
            b.index_copy_(self.slot_dim, self.written, want)
            untouched_ok &= torch.equal(b, r)
            b.index_copy_(self.slot_dim, self.written, got)
            max_diff = max(max_diff, (got - want).abs().max().item())
        return untouched_ok, max_diff

    def check(self, s: PoolState):
        ok_k, dk = self._compare(s.k, self.ref_k)
        ok_v, dv = self._compare(s.v, self.ref_v)
        dl = max((a - b).abs().max().item() for a, b in zip(s.logits, self.ref_logits))
        same_tokens = all(torch.equal(a.argmax(-1), b.argmax(-1)) for a, b in zip(s.logits, self.ref_logits))
        untouched_ok, max_diff = ok_k and ok_v, max(dk, dv)
        if untouched_ok and max_diff == 0.0 and dl == 0.0:
            return True, "bitwise equal"
        if untouched_ok and max_diff <= 1e-4 and dl <= 1e-3 and same_tokens:
            return True, f"allclose (written rows max|d|={max_diff:.1e}, logits {dl:.1e})"
        return False, (
            f"WRONG: untouched slots {'equal' if untouched_ok else 'CHANGED'}, written rows "
            f"max|d|={max_diff:.2e}, logits max|d|={dl:.2e}, argmax {'same' if same_tokens else 'differs'}"
        )


class GptFast(TokenPool):
    workload = layout = "gpt_fast"


# ----------------------------------------------------------------------------------------------------
# (c), (e), (f) Hugging Face decoders + StaticCache: Llama, and the report's families Qwen3 and gpt-oss
# ----------------------------------------------------------------------------------------------------


class HFDecoder(Case):
    """Greedy decode steps of a tiny random Hugging Face decoder (:mod:`.hf_models`) through the compiled
    forward, after an eager prefill of 8 tokens into a ``StaticCache`` of the workload's size. Checked
    after 6 steps: greedy tokens equal eager's."""

    family = "llama"
    check_after = 6
    dynamic = None
    # The seed families freeze their parameters; the later ones keep requires_grad=True as from_pretrained
    #   leaves them (the steps still run under torch.no_grad(), as users decode).
    frozen = True

    def __init__(self, max_cache_len: int, device: torch.device, max_steps: int):
        from . import hf_models

        self.size, self.device = max_cache_len, device
        self.fn, self.config = hf_models.tiny_decoder(self.family, max_cache_len, device, frozen=self.frozen)
        self.workload = f"hf_{self.family}"
        config = self.config
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        cache_bytes = 2 * config.num_hidden_layers * config.num_key_value_heads * max_cache_len * head_dim * 4
        self.size_note = f"{cache_bytes / 2**20:,.0f} MiB StaticCache"
        s = self.fresh()
        for _ in range(self.check_after):
            s.step(self.fn)
        self.ref_tokens = s.tokens

    def fresh(self):
        from . import hf_models

        return hf_models.Decode(self.fn, self.config, self.size).start()

    def call(self, fn, s, i):
        return fn(**s.step_inputs())

    def after_call(self, s, i, out):
        s.tokens.append(int(out.logits[0, -1].argmax()))

    def check(self, s):
        got = s.tokens[: len(self.ref_tokens)]
        if got == self.ref_tokens:
            return True, f"greedy tokens equal ({self.check_after} steps)"
        return False, f"WRONG: greedy tokens {got} != eager {self.ref_tokens}"


class HFLlama(HFDecoder):
    family = "llama"


class HFQwen3(HFDecoder):
    family = "qwen3"


class HFGptOss(HFDecoder):
    family = "gpt_oss"


class HFMistral(HFDecoder):
    # Past the sliding window: the tiny config's window is shorter than the prefill plus the warm-up steps.
    family, frozen = "mistral", False


class HFMixtral(HFDecoder):
    family, frozen = "mixtral", False


class HFQwen3Moe(HFDecoder):
    family, frozen = "qwen3_moe", False


class HFDeepSeekV3(HFDecoder):
    family, frozen = "deepseek_v3", False


# ----------------------------------------------------------------------------------------------------
# Registry
# ----------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Workload:
    name: str
    aliases: tuple[str, ...]
    title: str
    case: type[Case]  # case(size, device, max_steps)
    sizes: tuple[int, ...]
    quick_sizes: tuple[int, ...]
    reps: RepConfig
    quick_reps: RepConfig
    in_quick: bool = True  # part of a --quick run without --workloads
    plotted: bool = True  # a panel of the plot when measured at several sizes
    skip: tuple[str, ...] = ()  # backend key prefixes never run here (no row)
    quick_skip: tuple[str, ...] = ()  # ... left out of --quick runs (compilation dominates those)
    not_run: tuple[tuple[str, str], ...] = ()  # (backend key prefix, why): reported as n/a

    def rep_config(self, quick: bool) -> RepConfig:
        return self.quick_reps if quick else self.reps

    def runs(self, key: str, quick: bool) -> bool:
        return not key.startswith(self.skip + (self.quick_skip if quick else ()))

    def not_run_reason(self, key: str) -> str | None:
        return next((why for prefix, why in self.not_run if key.startswith(prefix)), None)


# The patched "functional" policy is stock behaviour, which a run of the stock build shows; quick runs
# leave it (and thunder.jit on the decoder) out.
WORKLOADS = {
    w.name: w
    for w in (
        Workload(
            "setitem",
            ("a",),
            "(a) k_buffer[loc] = k, bf16 [N, 8, 64]",
            Setitem,
            (4096, 262_144, 2_615_232),
            (4096, 65_536),
            RepConfig(2, 3, 200, 1.0),
            RepConfig(2, 3, 30, 0.3),
            skip=("thunderfx-torchcompile", "thunderfx-gqa-fold"),
        ),
        Workload(
            "token_pool",
            ("b",),
            "(b) token-pool decode step, 4-layer GQA decoder, f32 pool [N_pool, 2, 64] per layer",
            TokenPool,
            (65_536, 1_048_576),
            (65_536,),
            RepConfig(0, 3, 30, 1.5),
            RepConfig(0, 3, 8, 0.5),
            quick_skip=("jit-", "thunderfx-functional"),
            skip=("thunderfx-torchcompile", "thunderfx-gqa-fold"),
        ),
        # A layout variant of (b), for ThunderFX.
        Workload(
            "gpt_fast",
            ("d",),
            "(d) gpt-fast-style decode step, k_cache[:, :, input_pos] = k, f32 [1, 2, N, 64] per layer",
            GptFast,
            (65_536,),
            (65_536,),
            RepConfig(0, 3, 30, 1.5),
            RepConfig(0, 3, 8, 0.5),
            in_quick=False,
            skip=("jit-", "thunderfx-torchcompile", "thunderfx-gqa-fold"),
        ),
        Workload(
            "hf_llama",
            ("c", "hf"),
            "(c) HF LlamaForCausalLM + StaticCache, f32, greedy decode step after 8-token prefill",
            HFLlama,
            (4096, 65_536),
            (4096,),
            RepConfig(1, 3, 20, 1.5),
            RepConfig(1, 3, 6, 0.5),
            quick_skip=("thunderfx-functional", "thunderfx-torchcompile", "thunderfx-gqa-fold"),
            plotted=False,
            not_run=(("jit-", "thunder.jit is not run on the HF model (ThunderFX only)"),),
        ),
        Workload(
            "hf_qwen3",
            ("e", "qwen3"),
            "(e) HF Qwen3ForCausalLM + StaticCache, f32, greedy decode step after 8-token prefill",
            HFQwen3,
            (4096, 32_768),
            (4096,),
            RepConfig(1, 3, 20, 1.5),
            RepConfig(1, 3, 6, 0.5),
            in_quick=False,
            quick_skip=("thunderfx-functional", "thunderfx-torchcompile", "thunderfx-gqa-fold"),
            plotted=False,
            not_run=(("jit-", "thunder.jit is not run on the HF model (ThunderFX only)"),),
        ),
        Workload(
            "hf_gpt_oss",
            ("f", "gpt_oss"),
            "(f) HF GptOssForCausalLM (sliding window + MoE) + StaticCache, f32, greedy decode step",
            HFGptOss,
            (4096, 32_768),
            (4096,),
            RepConfig(1, 3, 20, 1.5),
            RepConfig(1, 3, 6, 0.5),
            in_quick=False,
            quick_skip=("thunderfx-functional", "thunderfx-torchcompile", "thunderfx-gqa-fold"),
            plotted=False,
            not_run=(("jit-", "thunder.jit is not run on the HF model (ThunderFX only)"),),
        ),
        *(
            Workload(
                f"hf_{case.family}",
                (letter, case.family),
                f"({letter}) HF {title} + StaticCache, f32, parameters requiring grad, greedy decode step under no_grad",
                case,
                (4096, 32_768),
                (4096,),
                RepConfig(1, 3, 20, 1.5),
                RepConfig(1, 3, 6, 0.5),
                in_quick=False,
                quick_skip=("thunderfx-functional", "thunderfx-torchcompile", "thunderfx-gqa-fold"),
                plotted=False,
                not_run=(("jit-", "thunder.jit is not run on the HF model (ThunderFX only)"),),
            )
            for letter, case, title in (
                ("g", HFMistral, "MistralForCausalLM past its sliding window"),
                ("h", HFMixtral, "MixtralForCausalLM (MoE)"),
                ("i", HFQwen3Moe, "Qwen3MoeForCausalLM (MoE)"),
                ("j", HFDeepSeekV3, "DeepseekV3ForCausalLM (MLA + MoE)"),
            )
        ),
    )
}
WORKLOAD_ORDER = tuple(WORKLOADS)
WORKLOAD_ALIASES = {alias: w.name for w in WORKLOADS.values() for alias in (w.name, *w.aliases)}
