"""Third-party Python packages: which image has which, and what Sandbox Fusion's python runtime
has. The python image holds the standard library alone; a solution that imports numpy fails
there with ModuleNotFoundError, scores 0 where Sandbox Fusion or prime_code score it 1, and
nothing else tells the user why their rewards dropped. `note` says it once per package in
the log (which image has it, whether Sandbox Fusion does), counting such cases, and never
changes the answer."""

from __future__ import annotations

import logging
import re
from typing import Any

from ..errors import CauseCounts
from .guests import AGENT, Image

logger = logging.getLogger("verl_hyperlight")

# What the agent image installs (hyperlight-unikraft's drivers/agent/Dockerfile, its `pip
# install` line), by the name a solution imports.
AGENT_PACKAGES: frozenset[str] = frozenset(
    (
        "numpy", "pandas", "scipy", "sklearn", "matplotlib", "seaborn", "sympy", "PIL",
        "openpyxl", "docx", "pptx", "pypdf", "pdfplumber", "reportlab", "requests", "httpx",
        "bs4", "dateutil", "pytz", "tqdm", "jinja2", "lxml", "pydantic", "tabulate", "chardet",
        "yaml",
    )
)  # fmt: skip

# What Sandbox Fusion's python runtime installs (SandboxFusion's runtime/python/
# requirements.txt) that code RL solutions import, by import name; its full list holds 100
# distributions, frameworks and services among them.
SANDBOX_FUSION_PACKAGES: frozenset[str] = frozenset(
    (
        "numpy", "pandas", "scipy", "sklearn", "matplotlib", "seaborn", "PIL", "openpyxl",
        "docx", "requests", "bs4", "lxml", "pydantic", "tabulate", "torch", "tensorflow",
        "numba", "gmpy2", "statsmodels", "cv2", "xgboost", "lightgbm", "nltk", "pulp", "cvxpy",
        "shapely", "psutil", "cryptography", "Crypto", "jwt", "flask", "django", "faker",
        "plotly",
    )
)  # fmt: skip

_MISSING = re.compile(r"ModuleNotFoundError: No module named '([\w.]+)'")

# The cases whose solution imported each package an image here lacks, so far.
missing = CauseCounts()


def note(response: dict[str, Any], image: Image) -> None:
    """If `response`'s run failed importing a package `image` lacks that another image here
    or Sandbox Fusion has, count it and say so (once per package, at WARNING)."""
    run = response.get("run_result")
    if not run or not run.get("return_code"):
        return
    stderr = run.get("stderr") or ""
    if "ModuleNotFoundError" not in stderr:
        return
    found = _MISSING.search(stderr)
    if found is None:
        return
    package = found[1].split(".")[0]
    where = _where(package, image)
    if where and missing.first(package):
        logger.warning(
            "verl-hyperlight: a solution failed importing %s, which %s lacks: %s (its answer is "
            "unchanged: a runtime error; said once per package, and counted: see the known "
            "limits)",
            package,
            image.label,
            "; ".join(where),
        )


def _where(package: str, image: Image) -> list[str]:
    """Where `package`, which `image` lacks, is: another image here, Sandbox Fusion."""
    where = []
    if image is not AGENT and package in AGENT_PACKAGES:
        where.append("the agent image has it (hyperlight://agent, memory_limit_mb 1536 or more)")
    if package in SANDBOX_FUSION_PACKAGES:
        where.append("Sandbox Fusion's python runtime has it, so such a solution scores there")
    return where
