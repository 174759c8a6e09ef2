"""Sandbox Fusion's HTTP API as a client asks it: one case POSTed to a /run_code URL (a
Sandbox Fusion service, or a `verl-hyperlight serve`), with the body verl's client sends, and
VERL_HYPERLIGHT_TOKEN, when set, as its bearer token."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from ..settings import TOKEN

# What a request may take beyond its run_timeout: the service's queue, a compile, the network.
MARGIN_SECONDS = 120.0


def post(
    url: str,
    code: str,
    stdin: str,
    run_timeout: float,
    memory_limit_mb: int,
    language: str = "python",
    compile_timeout: float = 10.0,
) -> tuple[dict[str, object] | None, str | None]:
    """Sandbox Fusion's request for one case, POSTed to `url` as verl's client sends it; the
    response, or what went wrong."""
    body = {
        "code": code,
        "stdin": stdin,
        "language": language,
        "compile_timeout": compile_timeout,
        "run_timeout": run_timeout,
        "memory_limit_MB": memory_limit_mb,
    }
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    token = TOKEN.value()
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        wait = compile_timeout + run_timeout + MARGIN_SECONDS
        with urllib.request.urlopen(request, timeout=wait) as reply:
            answer = json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        return None, f"{url} answered HTTP {exc.code}: {exc.read()[:500].decode(errors='replace')}"
    except (OSError, ValueError) as exc:
        return None, f"cannot ask {url}: {exc}"
    if not isinstance(answer, dict):
        return None, f"{url} answered {str(answer)[:200]!r}, not a response"
    return answer, None
