"""The backends: eager, Inductor, ThunderFX (per ``inplace_indexed_writes`` policy the build accepts, or
with its defaults; with ``torch_compile_ex``; with ``grouped_query_attention="fold"``) and ``thunder.jit``;
what a Thunder backend's traces say (segments, full-size copies)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import torch

from .measure import Segments, Unavailable, short_error

if TYPE_CHECKING:
    from collections.abc import Callable

# Report order. "-default": the option left out (how a build without the option runs).
BACKEND_ORDER = (
    "eager",
    "inductor",
    "thunderfx-default",
    "thunderfx-functional",
    "thunderfx-inductor",
    "thunderfx-inplace",
    "thunderfx-torchcompile",
    "thunderfx-gqa-fold",
    "jit-default",
    "jit-inplace",
)
POLICIES = ("functional", "inductor", "inplace")
_BOGUS = "__no_such_policy__"


@dataclasses.dataclass
class Compiled:
    fn: Callable
    fx_backend: Any = None  # ThunderCompiler
    jit_fn: Any = None  # thunder.jit result


@dataclasses.dataclass
class TraceInfo:
    """What the Thunder traces of one compiled backend say; every field maps onto a ``Row`` field."""

    segments: Segments | None = None
    full_size_copy_bytes: int | None = None
    full_size_copies: list[str] | None = None
    info_error: str | None = None


def _rejects_bogus_policy(make: Callable[[str], Any]) -> bool:
    """Whether ``make(policy)`` validates the option. Unknown options are silently accepted as compile
    options, so an option is only taken as supported if a bogus value is rejected."""
    try:
        make(_BOGUS)
    except (ValueError, TypeError):
        return True
    except Exception:
        return False
    return False


class Backends:
    def __init__(self, device: torch.device):
        self.device = device
        self._fx_policies: tuple[str, ...] | None = None
        self._jit_inplace: bool | None = None

    def fx_policies(self) -> tuple[str, ...]:
        """The ``ThunderCompiler(inplace_indexed_writes=...)`` values this build accepts."""
        if self._fx_policies is None:
            from thunder.dynamo import ThunderCompiler

            def make(policy):
                return ThunderCompiler(inplace_indexed_writes=policy)

            accepted = []
            if _rejects_bogus_policy(make):
                for policy in POLICIES:
                    try:
                        make(policy)
                        accepted.append(policy)
                    except Exception:
                        pass
            self._fx_policies = tuple(accepted)
        return self._fx_policies

    def jit_inplace(self) -> bool:
        """Whether ``thunder.jit`` accepts ``inplace_indexed_writes="inplace"`` (checked by compiling a write)."""
        if self._jit_inplace is None:
            import thunder

            def f(b, i, v):
                b[i] = v

            def make(policy):
                b = torch.zeros(4, 2, device=self.device)
                i, v = torch.tensor([1], device=self.device), torch.ones(1, 2, device=self.device)
                thunder.jit(f, inplace_indexed_writes=policy)(b, i, v)

            self._jit_inplace = False
            if _rejects_bogus_policy(make):
                try:
                    make("inplace")
                    self._jit_inplace = True
                except Exception:
                    pass
        return self._jit_inplace

    @staticmethod
    def gqa_fold() -> bool:
        """Whether the build has the grouped-query rewrite, whose ``"fold"`` attends a decode step as uncompiled
        Hugging Face code does (``thunderfx-gqa-fold``)."""
        try:
            import thunder.transforms.grouped_query_attention  # noqa: F401
        except ImportError:
            return False
        return True

    def resolve(self, wanted: list[str] | None) -> list[str]:
        """Backend keys to run, in report order. ``None``: eager, Inductor, ThunderFX with each policy the
        build accepts (``thunderfx-default`` if none) and ``thunder.jit`` (``"inplace"`` if accepted).
        ``"jit"`` in ``wanted`` means that ``thunder.jit`` variant."""
        jit = "jit-inplace" if self.jit_inplace() else "jit-default"
        if wanted is None:
            fx = [f"thunderfx-{p}" for p in self.fx_policies()] or ["thunderfx-default"]
            fold = ["thunderfx-gqa-fold"] if self.gqa_fold() else []
            wanted = ["eager", "inductor", *fx, "thunderfx-torchcompile", *fold, jit]
        keys = {jit if k == "jit" else k for k in wanted}
        unknown = keys - set(BACKEND_ORDER)
        if unknown:
            raise ValueError(f"unknown backends {sorted(unknown)}; expected some of {', '.join(BACKEND_ORDER)}")
        return [k for k in BACKEND_ORDER if k in keys]

    def compile(self, key: str, fn: Callable, dynamic: bool | None = False) -> Compiled:
        import thunder

        if key == "eager":
            return Compiled(fn)
        if key == "inductor":
            return Compiled(torch.compile(fn, backend="inductor", dynamic=dynamic))
        if key == "thunderfx-torchcompile":
            # ThunderFX's defaults plus Thunder's torch.compile fusion executor, which hands Inductor the
            # fusible regions of each Thunder segment (on CPU the default executors run op by op).
            from thunder.dynamo import ThunderCompiler
            from thunder.executors.torch_compile import torch_compile_ex

            backend = ThunderCompiler(executors=[torch_compile_ex, *thunder.get_default_executors()])
            return Compiled(torch.compile(fn, backend=backend, dynamic=dynamic), fx_backend=backend)
        if key == "thunderfx-gqa-fold":
            from thunder.dynamo import ThunderCompiler

            if not self.gqa_fold():
                raise Unavailable("unavailable in this build (no grouped-query rewrite)")
            backend = ThunderCompiler(grouped_query_attention="fold")
            return Compiled(torch.compile(fn, backend=backend, dynamic=dynamic), fx_backend=backend)
        if key.startswith("thunderfx-"):
            from thunder.dynamo import ThunderCompiler

            policy = key.removeprefix("thunderfx-")
            if policy == "default":
                backend = ThunderCompiler()
            elif policy in self.fx_policies():
                backend = ThunderCompiler(inplace_indexed_writes=policy)
            else:
                raise Unavailable(
                    f"unavailable in this build (ThunderCompiler has no inplace_indexed_writes={policy!r})"
                )
            return Compiled(torch.compile(fn, backend=backend, dynamic=dynamic), fx_backend=backend)
        if key == "jit-default":
            jfn = thunder.jit(fn)
            return Compiled(jfn, jit_fn=jfn)
        if key == "jit-inplace":
            if not self.jit_inplace():
                raise Unavailable("unavailable in this build (thunder.jit has no inplace_indexed_writes='inplace')")
            jfn = thunder.jit(fn, inplace_indexed_writes="inplace")
            return Compiled(jfn, jit_fn=jfn)
        raise ValueError(f"unknown backend {key!r}")

    @staticmethod
    def trace_info(c: Compiled) -> TraceInfo:
        """Segment counts (ThunderFX) and bytes of full-size copies of inputs per call in the Thunder
        execution traces (:mod:`thunder.examine.full_size_copies`)."""
        info = TraceInfo()
        if c.fx_backend is None and c.jit_fn is None:
            return info
        try:
            import thunder
            from thunder.examine.full_size_copies import find_full_size_copies, thunderfx_execution_traces

            if c.fx_backend is not None:
                b = c.fx_backend
                n_thunder = n_inductor = 0
                for si in b.subgraph_infos:
                    n_thunder += len(si.thunder_compiled_fns or [])
                    for cf in (si.submodule_to_compiled_functions or {}).values():
                        if getattr(cf.compiler, "name", "") == "TORCH_INDUCTOR":
                            n_inductor += 1
                info.segments = Segments(len(b.subgraph_infos), n_thunder, n_inductor)
                traces = thunderfx_execution_traces(b)
            else:
                traces = [thunder.last_traces(c.jit_fn)[-1]]
            copies = [cp for tr in traces for cp in find_full_size_copies(tr)]
            info.full_size_copy_bytes = sum(cp.nbytes for cp in copies)
            info.full_size_copies = [str(cp)[:300] for cp in copies[:16]]
        except Exception as e:  # the numbers are a diagnostic; never fail the benchmark for them
            info.info_error = short_error(e)
        return info
