"""verl-hyperlight: score verl's code rewards in local Hyperlight micro-VMs.

``run_code`` takes the arguments of verl's ``call_sandbox_api`` and returns what a Sandbox
Fusion service would; the ``verl.plugins`` entry point (``verl_hyperlight.plugin``) routes
``hyperlight://`` sandbox URLs to it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .errors import BackendError, HyperlightError, InvalidRequest

if TYPE_CHECKING:
    from .case.api import run_code

__version__ = "0.1.0"

__all__ = ["BackendError", "HyperlightError", "InvalidRequest", "__version__", "run_code"]


def __getattr__(name: str) -> Any:
    # run_code is imported on first use, so that importing the verl plugin (which verl does in
    # every process) runs no more than the plugin itself, and a broken installation is reported
    # by the plugin's own guard rather than lost in verl's DEBUG log.
    if name == "run_code":
        from .case.api import run_code

        return run_code
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
