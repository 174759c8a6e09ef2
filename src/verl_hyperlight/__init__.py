"""verl-hyperlight: score verl's code rewards in local Hyperlight micro-VMs.

``run_code`` takes the arguments of verl's ``call_sandbox_api`` and returns what a Sandbox
Fusion service would; the ``verl.plugins`` entry point (``verl_hyperlight.plugin``) routes
``hyperlight://`` sandbox URLs to it.
"""

from ._api import run_code
from ._errors import BackendError, HyperlightError, InvalidRequest

__version__ = "0.1.0"

__all__ = ["BackendError", "HyperlightError", "InvalidRequest", "__version__", "run_code"]
