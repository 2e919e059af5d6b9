"""The wheel declares the torch range it is tested with, so that `pip install .` in a fresh environment
gets a Thunder that imports (the base's own `torch>=2.7.1` let pip pick torch 2.14, where Thunder fails
at import)."""

from __future__ import annotations

import ast
import importlib.metadata
from pathlib import Path

from packaging.requirements import Requirement

from _support import REPO


def _declared_requirements() -> list[Requirement]:
    source = (REPO / "setup.py").read_text()
    (assign,) = [n for n in ast.parse(source).body if isinstance(n, ast.Assign) and n.targets[0].id == "TORCH_REQUIREMENT"]
    return [Requirement(assign.value.value)]


def test_torch_requirement_admits_the_tested_torch_and_excludes_the_ones_thunder_cannot_import():
    (torch_req,) = _declared_requirements()
    assert torch_req.name == "torch"
    tested = importlib.metadata.version("torch").split("+")[0]
    assert torch_req.specifier.contains(tested), (str(torch_req), tested)
    for unimportable in ("2.13.0", "2.14.1", "2.15.0"):
        assert not torch_req.specifier.contains(unimportable), (str(torch_req), unimportable)
