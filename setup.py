"""Builds the patched lightning-thunder wheel: the pinned base + thunder/ (added files) + patches/series.

    pip install .        # installs lightning-thunder 0.2.6+inplacewrites in place of stock

The base wheel is fetched from PyPI and checked against the sha256 in scripts/base.json.
"""

import sys
from pathlib import Path

from setuptools import find_packages, setup

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "scripts"))
import patchset  # noqa: E402

tree = patchset.compose(patchset.BUILD / "wheel-src")
pin = patchset.BASE_PIN

# The torch releases this build is tested with: exactly those the suite (`make test-torch VERSION=...`) passed
# on, so that `pip install .` neither replaces a torch this Thunder works with nor installs one it fails on.
# Passed: 2.7.1, 2.8.0, 2.9.1 (the pin of `make test`), 2.10.0, 2.11.0, 2.12.1 (2.12 with the compat patch
# 0001; stock 0.2.6 does not run ThunderFX there), 2.13.0 (with 0070: Dynamo 2.13 reads the grad_fn of a
# torch_compile_ex region's inputs) and 2.14.1 (with 0071: pytorch/pytorch#197893, Inductor returning an input
# for `x * 1`), 2.15.0 (2026-12-07, 63 patches; PyPI's CUDA build run on the CPU). Not tested: 2.16 and later.
TORCH_REQUIREMENT = "torch>=2.7.1,<2.16"


def install_requires() -> list[str]:
    return [TORCH_REQUIREMENT] + [r for r in patchset.base_requirements() if not r.replace(" ", "").startswith("torch")]

setup(
    name=pin["distribution"],
    version=f"{pin['version']}+{pin['local_version']}",
    description="Lightning Thunder with in-place indexed writes (KV-cache updates move only the bytes they write)",
    long_description=(ROOT / "README.md").read_text(),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.10",
    packages=find_packages(str(tree), include=["thunder", "thunder.*"]),
    package_dir={"": str(tree.relative_to(ROOT))},
    package_data={"thunder": ["py.typed"]},
    install_requires=install_requires(),
)
