"""The wheel declares the torch range the suite passed on, so that `pip install .` in a fresh environment
neither replaces a torch this Thunder works with nor installs one it fails on (the base's own
`torch>=2.7.1` let pip pick torch 2.14, where stock Thunder fails at import)."""

from __future__ import annotations

import ast
import importlib.metadata

from packaging.requirements import Requirement

from _support import REPO

# `make test-torch VERSION=...` (README, "Limits", says when and on how many patches): the suite passed on these ...
PASSED = ("2.7.1", "2.8.0", "2.9.1", "2.10.0", "2.11.0", "2.12.1", "2.13.0", "2.14.1", "2.15.0")
# ... and was never run on these (older than the base's own floor, or not released when the list was made).
UNTESTED = ("2.6.0", "2.16.0")


def _declared_requirements() -> list[Requirement]:
    source = (REPO / "setup.py").read_text()
    (assign,) = [n for n in ast.parse(source).body if isinstance(n, ast.Assign) and n.targets[0].id == "TORCH_REQUIREMENT"]
    return [Requirement(assign.value.value)]


def test_torch_requirement_is_exactly_the_releases_the_suite_passed_on():
    (torch_req,) = _declared_requirements()
    assert torch_req.name == "torch"
    running = importlib.metadata.version("torch").split("+")[0]
    assert torch_req.specifier.contains(running), (str(torch_req), running)
    for passed in PASSED:
        assert torch_req.specifier.contains(passed), (str(torch_req), passed)
    for untested in UNTESTED:
        assert not torch_req.specifier.contains(untested), (str(torch_req), untested)
