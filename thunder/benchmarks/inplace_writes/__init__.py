"""Benchmark of in-place indexed writes into a KV cache: eager, Inductor, ThunderFX and ``thunder.jit``.

What and why
------------
A decode step writes one token's keys and values into a preallocated KV cache: ``k_buffer[loc] = k``.
Thunder's functional lowering of such an in-place indexed write on a graph input is a functional op plus a
copy back, ``b = buf.clone(); b[idx] = v; buf.copy_(b)``: passes over the whole cache to write one row, so
the cost of a decode step grows with the size of the cache instead of with the size of the write. The
``inplace_indexed_writes`` option (``"inplace"``: Thunder writes only the indexed elements; ``"inductor"``:
ThunderFX routes the writes to Inductor; ``"functional"``: the clone-and-copy lowering) is what this
measures, on these workloads (:mod:`.workloads`):

``a`` / ``setitem``
    The reported graph, ``def write(k_buffer, loc, k): k_buffer[loc] = k`` with a bf16 buffer
    ``[N, 8, 64]``, ``loc`` int64 ``[1]`` and ``k`` ``[1, 8, 64]``, for N = 4,096, 262,144 and 2,615,232.
``b`` / ``token_pool``
    One decode step of a small Llama-style decoder (random weights, 4 layers, 8 query heads, 2 KV heads,
    head_dim 64, hidden 512) whose KV cache is a flat token pool per layer, as in SGLang's
    ``MHATokenToKVPool``: ``k_buffer[layer]`` is ``[N_pool, kv_heads, head_dim]``, each step writes
    ``k_buffer[layer][loc] = k`` (and ``v``) and attends over the request's 128 slots gathered from the
    pool, ``k_buffer[layer][req_slots]``. The write is the only work that grows with ``N_pool``.
``d`` / ``gpt_fast``
    The same decoder with a gpt-fast-style cache ``[1, kv_heads, N, head_dim]`` written with
    ``k_cache[:, :, input_pos] = k`` (one size, ThunderFX backends only: a layout variant of ``b``).
``c`` / ``hf_llama``
    Hugging Face ``LlamaForCausalLM`` (tiny random config, float32) with a ``StaticCache``, which writes
    with ``keys.index_copy_(2, cache_position, k)``; greedy decode steps after an 8-token prefill through
    the compiled model forward. Here attention over the whole static cache grows with the cache too.
``e`` / ``hf_qwen3``
    The same with the report's Qwen3 family (``Qwen3ForCausalLM``, 2 layers, 4 query / 2 KV heads of 64):
    its attention repeats the KV heads (``repeat_kv``) under a compiler, which copied each layer's cache
    every step until Thunder attended to the grouped heads directly. Static caches of 4,096 and 32,768.
``f`` / ``hf_gpt_oss``
    The report's gpt-oss family (``GptOssForCausalLM``: a sliding-window and a full-attention layer,
    attention sinks, 4-expert top-2 MoE). The decode graph carries the sliding-window layer's position as
    a symbolic int, and the MoE router ops split it into several segments.
``g`` / ``hf_mistral``, ``h`` / ``hf_mixtral``, ``i`` / ``hf_qwen3_moe``, ``j`` / ``hf_deepseek_v3``
    More families, with the parameters requiring grad as ``from_pretrained`` leaves them (the steps run
    under ``torch.no_grad()``, as users decode): Mistral decoding past its 12-slot sliding window, the
    MoE models Mixtral and Qwen3-MoE, and DeepSeek-V3 (multi-head latent attention + MoE). Static
    caches of 4,096 and 32,768.

Backends (:mod:`.backends`), all measured in the same process: eager; ``torch.compile`` with Inductor;
ThunderFX (``torch.compile(backend=thunder.dynamo.ThunderCompiler(...))``) with each
``inplace_indexed_writes`` policy the installed Thunder accepts (``thunderfx-default``, the option left
out, on a build without it), with ``torch_compile_ex`` (``thunderfx-torchcompile``) and with
``grouped_query_attention="fold"`` (``thunderfx-gqa-fold``) on the decoders; ``thunder.jit`` with
``inplace_indexed_writes="inplace"`` where accepted (``jit-default`` otherwise) on the plain-function workloads. To compare two Thunder builds, run the
module under each and compare the rows; ``--backends thunderfx-default jit-default`` measures a build's
defaults.

For each workload, size and backend the report (:mod:`.report`) gives the median, min and max time per
call (or decode step), the ratio to eager and to Inductor, the number of Thunder and Inductor segments
ThunderFX split the graph into, the bytes written per call by full-size copies of inputs that
:func:`thunder.examine.full_size_copies.find_full_size_copies` finds in the Thunder execution traces, and
a correctness check against eager (the cache after the same steps: untouched rows bitwise equal and
written rows equal or allclose; greedy tokens equal for the Hugging Face decoders). A backend that fails is reported with the
error, never dropped. Every row goes through the same loop (:func:`.measure.measure`).

How to run
----------
::

    python -m thunder.benchmarks.inplace_writes                 # everything: minutes on 2 CPU cores
    python -m thunder.benchmarks.inplace_writes --quick         # a, b, c at small sizes, few repetitions (on
                                                                # b and c no thunder.jit, no "functional"): ~1 min
    python -m thunder.benchmarks.inplace_writes --workloads a b --device cpu --out results/

It writes a table to the terminal, ``<out>/<UTC timestamp>.json`` (machine, versions, command line, all
numbers) and ``<out>/<UTC timestamp>.png`` (time against size, log-log, one line per backend), both also
copied to ``<out>/latest.json`` and ``<out>/latest.png``. On a machine with a GPU the default device is
CUDA and calls are timed with CUDA events between ``torch.cuda.synchronize()`` calls; on CPU with
``time.perf_counter_ns``. Calls slower than about 0.2 s get fewer repetitions (at least 3); the table
marks those with ``*``. Each backend starts from the same cache contents and is compiled (and run once)
before it is timed; the first call's time is reported separately.

The full run peaks at about 9 GB of memory (the 4 GiB token pool, eager's reference copy of it, and the
functional path's transient copies). CPU timings are very sensitive to other processes on the machine
(OpenMP threads of competing processes fight for cores).
"""

from .backends import BACKEND_ORDER, Backends
from .cli import RunConfig, build_parser, config_from_args, main, parse_args, result_dict, run
from .measure import Row, Segments

__all__ = [
    "BACKEND_ORDER",
    "Backends",
    "Row",
    "RunConfig",
    "Segments",
    "build_parser",
    "config_from_args",
    "main",
    "parse_args",
    "result_dict",
    "run",
]
