"""A CPU stand-in for the nvFuser executor, for tests on machines without CUDA.

On a GPU, Thunder's default fusion executor is nvFuser, and its ``fusion_pass`` reorders and merges
work: dataflow fusion (``fuse_bound_symbols``), rematerialization, removal of redundant casts, its own
CSE and DCE. None of that runs in CPU tests, where no executor fuses. This stand-in runs that same
code on the CPU; only the kernels are different:

- ``thunder/executors/nvfuserex_impl.py`` is loaded, under a private module name, with a stub
  ``nvfuser_direct`` module that is visible only while it loads. Its ``register_supported`` calls
  build the list of what the stand-in claims, checkers included (``nv_enable_scatter`` and the other
  compile options keep their meaning), so the list is nvFuser's, not a copy of it.
- :class:`nvFuserStandinExecutor` subclasses that module's ``nvFuserExecutor``: ``fusion_pass``,
  ``fuse``, ``cse``, the fusion names (``nvFusion0``, ..., which rematerialization and the in-place
  ``copy_`` checks look for), the optimization fuel, all nvFuser's own.
- In that private module the CPU takes CUDA's place (its ``DeviceType.CUDA`` is the CPU device type),
  so the checkers and ``has_cuda_input_or_output`` accept CPU tensors where nvFuser accepts CUDA ones.
- Where nvFuser builds a ``FusionDefinition``, the stand-in builds a :class:`TorchFusion`: the region's
  bound symbols as a trace run by the torch executor. ``prims.copy_`` keeps nvFuser's meaning inside a
  fusion: inside it, its result is a new tensor holding the source (``fd.ops.set``) and later reads
  of the destination see its old value; the destination is written when the fusion ends
  (``fd.add_output(..., alias_input=destination)``), and where the result is an output of the fusion,
  the fusion returns the destination's tensor (nvFuser's ``AllocationType::ReuseBuffer``).

What it does not do: it claims nothing nvFuser does not, but it drops the few claims whose execution
needs an nvFuser-only operator (the ``execution_transform`` of SDPA and cross entropy, and the
``nv_*`` operators they make); kernels are torch's, so values may differ from nvFuser's in the last
bits where nvFuser would reorder a reduction. The version it reports is :data:`NVFUSER_VERSION`, the
nvFuser built for this torch, which decides the version-dependent claims.

Nothing else sees nvFuser as available: ``thunder.executors.nvfuser_available()`` stays False,
the executor named "nvfuser" stays unregistered, and ``import nvfuser`` still fails.

Use::

    from thunder.tests.nvfuser_standin import nvfuser_standin_ex, executors_with_standin

    jfn = thunder.jit(fn, executors=executors_with_standin())     # as on a GPU: nvFuser's place in the defaults
    backend = ThunderCompiler(executors=executors_with_standin())  # ThunderFX too
"""

from __future__ import annotations

import importlib.util
import sys
import types
from collections.abc import Sequence
from pathlib import Path

import torch

import thunder.executors.nvfuserex as _nvfuserex
import thunder.extend as _extend
from thunder.core import prims
from thunder.core.codeutils import SigInfo
from thunder.core.devices import DeviceType
from thunder.core.proxies import Proxy, variableify
from thunder.core.symbol import BoundSymbol
from thunder.core.trace import TraceCtx, tracectx
from thunder.executors.passes import transform_for_execution

__all__ = ["NVFUSER_VERSION", "nvfuser_standin_ex", "executors_with_standin", "TorchFusion", "claimed_ids"]

# The nvFuser built for torch 2.9 (nvfuser-cu128-torch29). It decides the version-dependent parts of
# nvfuserex_impl: direct bindings (>= 0.2.34), which ops are registered and how their checkers decide.
NVFUSER_VERSION = "0.2.35"

_IMPL_MODULE_NAME = "_thunder_nvfuser_standin_impl"


class _Placeholder(type):
    """The type of every nvFuser object the executor module names at import (``DataType.Float``,
    ``ParallelType``, ``FusionDefinition`` in annotations). They are classes, so that annotations such
    as ``None | FusionDefinition`` evaluate; none is ever called: the stand-in builds no nvFuser kernel."""

    def __getattr__(cls, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _placeholder(f"{cls.__name__}.{attr}")

    def __call__(cls, *args, **kwargs):
        raise RuntimeError(f"the nvFuser stand-in builds no nvFuser objects ({cls.__name__} was called)")


def _placeholder(name: str) -> _Placeholder:
    return _Placeholder(name, (), {})


def _stub_nvfuser_module(name: str) -> types.ModuleType:
    module = types.ModuleType(name)
    module.version = lambda: NVFUSER_VERSION
    module.__getattr__ = lambda attr: _placeholder(f"{name}.{attr}")  # PEP 562: `from nvfuser_direct import X`
    return module


class _CpuInCudasPlace:
    """The private module's ``DeviceType``: ``CUDA`` is the CPU device type, so every check nvFuser
    makes for "on the GPU" is made for "on the CPU"."""

    CPU = DeviceType.CPU
    CUDA = DeviceType.CPU
    META = DeviceType.META


def _load_nvfuser_executor_module() -> types.ModuleType:
    """nvfuserex_impl.py as a private module, loaded with the stub nvFuser; afterwards nothing outside
    it sees the stub, and the "nvfuser" executor it registers is unregistered again."""
    path = Path(_nvfuserex.__file__).with_name("nvfuserex_impl.py")
    stubs = {name: _stub_nvfuser_module(name) for name in ("nvfuser_direct", "nvfuser")}
    saved_modules = {name: sys.modules.get(name) for name in stubs}
    saved_version = _nvfuserex.nvfuser_version
    saved_executor = _extend._executor_map.get("nvfuser")
    spec = importlib.util.spec_from_file_location(_IMPL_MODULE_NAME, path)
    module = importlib.util.module_from_spec(spec)
    try:
        sys.modules.update(stubs)
        from looseversion import LooseVersion

        _nvfuserex.nvfuser_version = lambda: LooseVersion(NVFUSER_VERSION)
        sys.modules[_IMPL_MODULE_NAME] = module  # its dataclasses look their module up while being made
        spec.loader.exec_module(module)
    finally:
        _nvfuserex.nvfuser_version = saved_version
        for name, saved in saved_modules.items():
            if saved is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = saved
        if saved_executor is None:
            _extend._executor_map.pop("nvfuser", None)
        else:
            _extend._executor_map["nvfuser"] = saved_executor
    module.DeviceType = _CpuInCudasPlace
    module.device_supports_fp8 = lambda: False  # asks the CUDA driver; no fp8 fusions on the CPU
    module.create_fusion_definition_wrapper = TorchFusion  # what fuse() builds for a region
    return module


class TorchFusion:
    """A fusion region run by the torch executor, with nvFuser's meaning of ``prims.copy_``.

    Called as nvFuser's ``FusionDefinitionWrapper`` is: with the region's inputs in order, it returns
    the region's outputs in order. Each ``copy_(src, dst)`` of the region becomes ``out = clone(src)``
    in the trace that runs, and ``dst`` (a region input) receives ``out`` when the region is done, in
    program order; reads of ``dst`` inside the region see its value from before the fusion. Where ``out``
    is also an output of the region, the region returns ``dst`` itself, as nvFuser does (an output
    aliased to an input reuses the input's buffer), so a later write into that output lands in ``dst``.
    """

    def __init__(self, bsyms: Sequence[BoundSymbol], name: str, inputs: Sequence, outputs: Sequence):
        self.name = name
        input_position = {variableify(p): k for k, p in enumerate(inputs) if isinstance(p, Proxy)}
        body: list[BoundSymbol] = []
        self.written_inputs: list[int] = []  # positions of the inputs copy_ writes, in program order
        written_values: list[Proxy] = []
        for bsym in bsyms:
            if bsym.sym.id != prims.PrimIDs.COPY_:
                body.append(bsym)
                continue
            src, dst = bsym.args[0], bsym.args[1]
            if variableify(dst) not in input_position:
                # nvFuser aliases an output only to a fusion input
                raise AssertionError(f"{name}: copy_ into {dst.name}, which is not an input of the fusion")
            body.append(prims.clone.bind(src, output=bsym.output))
            self.written_inputs.append(input_position[variableify(dst)])
            written_values.append(bsym.output)
        self.n_outputs = len(outputs)
        # A copy_ result that is also an output of the fusion: nvFuser returns the destination itself
        # (an output aliased to an input with AllocationType::ReuseBuffer is that input's tensor).
        written_by = {variableify(v): p for v, p in zip(written_values, self.written_inputs)}
        self.aliased_outputs = {
            k: written_by[variableify(o)]
            for k, o in enumerate(outputs)
            if isinstance(o, Proxy) and variableify(o) in written_by
        }
        self._callable = _torch_callable(body, list(inputs), [*outputs, *written_values])

    def __call__(self, *args):
        with torch.no_grad():
            results = self._callable(*args)
            for position, value in zip(self.written_inputs, results[self.n_outputs :]):
                args[position].copy_(value)
        outputs = list(results[: self.n_outputs])
        for k, position in self.aliased_outputs.items():
            outputs[k] = args[position]
        return outputs

    def __repr__(self) -> str:
        return f"TorchFusion({self.name})"


def _torch_callable(bsyms: list[BoundSymbol], inputs: list, outputs: list):
    """A Python callable of inputs -> tuple of outputs running bsyms through the torch executor."""
    from thunder.executors.torchex import ex as torch_ex

    region = TraceCtx(None)
    region.args, region.kwargs = inputs, {}
    region.names = {p.name for p in inputs if isinstance(p, Proxy)}
    with tracectx(region):
        for p in inputs:
            prims.unpack_trivial(p, name=p.name)
    region.bound_symbols += bsyms
    region.bound_symbols.append(prims.python_return.bind(tuple(outputs), output=None))
    for bsym in bsyms:
        for sub in (bsym, *bsym.subsymbols):
            for out in sub.flat_outs:
                if isinstance(out, Proxy) and out.name not in region.names:
                    region.add_name(out.name)
    region._siginfo = SigInfo("standin_fusion")
    region._siginfo.args = [(p.name, None) for p in inputs]
    return transform_for_execution(region, executors_list=(torch_ex,)).python_callable(include_decorators=False)


_impl = _load_nvfuser_executor_module()


def _needs_nvfuser_only_operator(sym_id, info) -> bool:
    """Claims whose execution is an nvFuser-only operator (nv_sdpfa_fwd, nv_cross_entropy_fwd, ...):
    the torch executor cannot run them."""
    return info.execution_transform is not None or sym_id in _impl.ex.opmap


class nvFuserStandinExecutor(_impl.nvFuserExecutor):
    """nvFuser's executor with torch kernels, on the CPU (see the module docstring)."""

    def __init__(self):
        super().__init__()
        self._name = "nvfuser_standin"
        self._implmap = {
            sym_id: info for sym_id, info in _impl.ex.implmap.items() if not _needs_nvfuser_only_operator(sym_id, info)
        }


def claimed_ids() -> frozenset:
    """The ids of the symbols the stand-in may claim: nvFuser's registrations, less those above."""
    return frozenset(nvfuser_standin_ex.implmap)


nvfuser_standin_ex = nvFuserStandinExecutor()
_extend.register_executor(nvfuser_standin_ex)


def executors_with_standin(executors: Sequence | None = None) -> list:
    """executors (default: Thunder's defaults) with the stand-in where nvFuser is on a GPU: before the
    torch executor, replacing nvFuser if it is there."""
    executors = list(_extend.get_default_executors() if executors is None else executors)
    executors = [ex for ex in executors if getattr(ex, "name", ex) not in ("nvfuser", "nvfuser_standin")]
    names = [getattr(ex, "name", ex) for ex in executors]
    at = names.index("torch") if "torch" in names else len(executors)
    return executors[:at] + [nvfuser_standin_ex] + executors[at:]
