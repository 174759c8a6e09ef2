"""The verl glue: importing this module sends ``hyperlight://`` sandbox URLs to run_code.

verl (0.9+) imports every ``verl.plugins`` entry point during ``import verl`` and swallows
their errors at DEBUG, so this module does its work as an import side effect and reports any
problem at WARNING itself. verl 0.6-0.8 import it through ``VERL_USE_EXTERNAL_MODULES``.

No verl, released or main, has a registry of sandbox runners keyed by URL scheme, so the plugin
replaces ``call_sandbox_api`` in verl's sandbox module with a wrapper that sends our URLs to
run_code and every other call to verl's function unchanged. verl looks that name up in the
module at call time, so every call is caught.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import logging
from collections.abc import Callable
from typing import Any

from .case.url import is_ours

logger = logging.getLogger("verl_hyperlight")

SANDBOX_MODULE = "verl.utils.reward_score.sandbox_fusion.utils"
_WRAPPED_MARK = "__verl_hyperlight_original__"


def _wrap(original: Callable[..., Any], run_code: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def call_sandbox_api(*args: Any, **kwargs: Any) -> Any:
        url = kwargs.get("sandbox_fusion_url", args[0] if args else None)
        if is_ours(url):
            return run_code(*args, **kwargs)
        return original(*args, **kwargs)

    setattr(call_sandbox_api, _WRAPPED_MARK, original)
    return call_sandbox_api


def install() -> str:
    """Route ``hyperlight://`` URLs in the running verl; says how (or why not)."""
    if importlib.util.find_spec("verl") is None:
        return "verl is not installed; nothing to do"
    # Imported here, inside the guard below, so a broken installation is logged, not lost.
    from .case.api import run_code

    try:
        utils = importlib.import_module(SANDBOX_MODULE)
    except Exception as exc:  # reported, never raised into import verl
        logger.warning(
            "verl-hyperlight: cannot import %s (%r): hyperlight:// sandbox URLs will fail; "
            "this verl's layout is not one verl-hyperlight supports",
            SANDBOX_MODULE,
            exc,
        )
        return "verl's sandbox module is missing"
    original = getattr(utils, "call_sandbox_api", None)
    if not callable(original):
        logger.warning(
            "verl-hyperlight: %s has no call_sandbox_api: hyperlight:// sandbox URLs will fail; "
            "this verl's layout is not one verl-hyperlight supports",
            SANDBOX_MODULE,
        )
        return "verl's call_sandbox_api is missing"
    if hasattr(original, _WRAPPED_MARK):
        return "already installed"
    setattr(utils, "call_sandbox_api", _wrap(original, run_code))  # noqa: B010 - a module we do not type
    return f"wrapped {SANDBOX_MODULE}.call_sandbox_api"


try:
    STATE = install()
except Exception as _exc:  # verl would hide this at DEBUG; say it loudly
    logger.warning("verl-hyperlight: the verl plugin failed to install: %r", _exc)
    STATE = f"failed: {_exc!r}"
else:
    logger.debug("verl-hyperlight plugin: %s", STATE)
