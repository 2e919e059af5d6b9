"""Helpers shared by the tests. They work on the patched build and on the pristine base
(scripts/python-stock), so that a test of the fix fails on stock at its assertion, not at an import."""

from __future__ import annotations

import importlib
import importlib.util
import operator
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent


def load_overlay_module(name: str):
    """Import thunder.<name> from the build under test, or, where it lacks the module (stock), from
    this repository's thunder/ overlay. Only for modules that depend on Thunder's core alone."""
    try:
        return importlib.import_module(f"thunder.{name}")
    except ModuleNotFoundError:
        path = REPO / "thunder" / (name.replace(".", "/") + ".py")
        spec = importlib.util.spec_from_file_location(f"_overlay_{name.replace('.', '_')}", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
        spec.loader.exec_module(module)
        return module


full_size_copies = load_overlay_module("examine.full_size_copies")


def thunderfx(fn, *, fullgraph: bool = True, **options):
    """fn compiled with a fresh ThunderCompiler(**options); returns (compiled fn, backend)."""
    from thunder.dynamo import ThunderCompiler

    torch._dynamo.reset()
    backend = ThunderCompiler(**options)
    return torch.compile(fn, backend=backend, fullgraph=fullgraph), backend


def full_copies_in(backend) -> list:
    """Full-size copies of inputs in every Thunder segment's execution trace."""
    import thunder

    found = []
    for info in backend.subgraph_infos:
        for fn in info.thunder_compiled_fns:
            found += full_size_copies.find_full_size_copies(thunder.last_traces(fn)[-1])
    return found


def split_reason_types(backend) -> list[str]:
    return [r.reason_type.name for info in backend.subgraph_infos for r in (info.split_reasons or [])]


def _format_arg(a) -> str:
    if isinstance(a, torch.fx.Node):
        return a.name
    if isinstance(a, (tuple, list)):
        inner = ", ".join(_format_arg(x) for x in a)
        return f"({inner},)" if isinstance(a, tuple) and len(a) == 1 else (f"({inner})" if isinstance(a, tuple) else f"[{inner}]")
    if isinstance(a, slice):
        return f"slice({a.start}, {a.stop}, {a.step})"
    return repr(a)


def _format_target(node: torch.fx.Node) -> str:
    if node.op == "call_method":
        return f".{node.target}"
    if node.target is operator.setitem:
        return "setitem"
    if node.target is operator.getitem:
        return "getitem"
    return getattr(node.target, "__name__", str(node.target))


def describe_split(backend) -> str:
    """The split graphs as compact text: each segment, which compiler runs it, and its nodes."""
    from thunder.dynamo.utils import CompilerType

    lines = []
    for info in backend.subgraph_infos:
        originals = list(info.submodule_to_compiled_functions.items())
        for (module, compiled), node in zip(
            originals, [n for n in info.split_graph_module.graph.nodes if n.op == "call_module"]
        ):
            kind = "thunder" if compiled.compiler == CompilerType.THUNDER else "inductor"
            params = [n.name for n in module.graph.nodes if n.op == "placeholder"]
            lines.append(f"{kind}: {node.target}({', '.join(params)})")
            for n in module.graph.nodes:
                if n.op in ("call_function", "call_method"):
                    args = ", ".join(_format_arg(a) for a in n.args)
                    kwargs = "".join(f", {k}={_format_arg(v)}" for k, v in n.kwargs.items())
                    lines.append(f"    {n.name} = {_format_target(n)}({args}{kwargs})")
    return "\n".join(lines)


_STOCK_PROBE = """
import torch
from thunder.dynamo import ThunderCompiler

def write(buf, loc, k):
    buf[loc] = k
    return buf.sum()

buf = torch.zeros(8, 2)
torch.compile(write, backend=ThunderCompiler())(buf, torch.tensor([3]), torch.ones(1, 2))
assert buf[3].eq(1).all()
"""


def stock_thunderfx_error() -> str | None:
    """None when the pristine base (scripts/python-stock) runs a one-write graph under ThunderFX on this
    torch; else the last line of its error. Stock 0.2.6 fails on torch releases newer than it (2.12: the
    split GraphModule's submodules are made lazily; 2.13: it does not import), so an A/B against stock can
    only say that stock does not run there."""
    import os
    import subprocess

    proc = subprocess.run(
        [str(REPO / "scripts" / "python-stock"), "-c", _STOCK_PROBE],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    if proc.returncode == 0:
        return None
    lines = (proc.stderr or proc.stdout).strip().splitlines()
    return lines[-1] if lines else f"exit status {proc.returncode}"
