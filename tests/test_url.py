"""Sandbox URLs: one parser says which are ours and what a well-formed one names, and the verl
plugin and the code tool's config agree with it."""

from __future__ import annotations

import pytest

from verl_hyperlight import plugin, run_code
from verl_hyperlight.agent.calls import ToolSettings
from verl_hyperlight.case import url as _url
from verl_hyperlight.errors import InvalidRequest

REFERENCE = "registry.example/org/python:1.2"
WELL_FORMED = {
    "hyperlight://": "python",
    "hyperlight:///": "python",
    "hyperlight://python": "python",
    "HYPERLIGHT://python/": "python",
    "hyperlight://?": "python",
    "hyperlight://agent": "agent",
    "Hyperlight://agent?&": "agent",
    f"hyperlight://{REFERENCE}": REFERENCE,
    f"hyperlight://{REFERENCE}/": REFERENCE,
}
# Ours, and malformed: each refused with what to give instead.
MALFORMED = {
    "hyperlight:": "did you mean 'hyperlight://'? verl-hyperlight serves hyperlight://, hy",
    "hyperlight:/": "did you mean 'hyperlight://'? verl-hyperlight serves",
    "HyperLight:/agent": "did you mean 'hyperlight://agent'? verl-hyperlight serves",
    "hyperlight:agent": "did you mean 'hyperlight://agent'? verl-hyperlight serves",
    "hyperlight://not an image": "after hyperlight:// give nothing (the python image), 'agent'",
    "hyperlight://nope": "after hyperlight:// give nothing (the python image), 'agent'",
    "hyperlight://?ray=a b": "ray='a b' is not a Ray resource name",
    "hyperlight://agent?ray=%7B": "ray='%7B' is not a Ray resource name",
    f"hyperlight://{REFERENCE}?&x=1&y": "verl-hyperlight knows no option 'x'",
}
NOT_OURS = ["http://sandbox:8080/run_code", "https://sandbox/run_code", "hyperlight", "ftp://x"]


@pytest.mark.parametrize(("url", "image"), WELL_FORMED.items())
def test_each_well_formed_url_names_its_image_and_no_options(url: str, image: str) -> None:
    assert _url.is_ours(url)
    assert _url.parse_url(url) == _url.SandboxURL(image, {}, None, url)


RAY_URLS = {
    "hyperlight://?ray": ("python", "hyperlight", "hyperlight://"),
    "hyperlight://agent?ray": ("agent", "hyperlight", "hyperlight://agent"),
    "HYPERLIGHT://agent/?ray=kvm-nodes": ("agent", "kvm-nodes", "HYPERLIGHT://agent/"),
    f"hyperlight://{REFERENCE}?ray=my.res_1": (REFERENCE, "my.res_1", f"hyperlight://{REFERENCE}"),
    "hyperlight://?ray=": ("python", "hyperlight", "hyperlight://"),
}


@pytest.mark.parametrize(("url", "expected"), RAY_URLS.items())
def test_ray_names_the_resource_and_the_url_its_node_runs(
    url: str, expected: tuple[str, str, str]
) -> None:
    parsed = _url.parse_url(url)
    assert (parsed.image, parsed.ray, parsed.local) == expected
    assert _url.parse_url(parsed.local).ray is None


@pytest.mark.parametrize(("url", "says"), MALFORMED.items())
def test_a_malformed_url_of_ours_is_refused_saying_what_is_wrong(url: str, says: str) -> None:
    assert _url.is_ours(url)
    with pytest.raises(InvalidRequest) as refused:
        _url.parse_url(url)
    assert str(refused.value).startswith(f"unsupported sandbox URL {url!r}: ")
    assert says in str(refused.value)
    response, error = run_code(url, "print(1)", None, None, 10, None)
    assert response is None and error == f"Invalid request: {refused.value}"


@pytest.mark.parametrize("url", [*NOT_OURS, "", None, 7])
def test_anything_else_is_not_ours(url: object) -> None:
    assert not _url.is_ours(url)
    with pytest.raises(InvalidRequest, match="verl-hyperlight serves hyperlight://"):
        _url.parse_url(url)


def test_options_are_read_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_url, "OPTIONS", frozenset({"ray", "name"}))
    parsed = _url.parse_url("hyperlight://agent?ray&name=a=b&&name=c")
    assert parsed.options == {"ray": None, "name": "c"}
    assert parsed.local == "hyperlight://agent?name=a=b&&name=c"
    assert _url.parse_url("hyperlight://?name=").options == {"name": ""}
    with pytest.raises(InvalidRequest, match="knows no option 'other'"):
        _url.parse_url("hyperlight://?ray&other")


@pytest.mark.parametrize("url", [*WELL_FORMED, *MALFORMED, *NOT_OURS])
def test_the_plugin_and_the_code_tool_agree_with_the_parser(url: str) -> None:
    assert plugin.is_ours(url) == _url.is_ours(url)
    config = {"sandbox_fusion_url": url}
    if url in WELL_FORMED:
        assert ToolSettings.from_config(config).in_micro_vms
    elif url in MALFORMED:
        with pytest.raises(ValueError) as refused:
            ToolSettings.from_config(config)
        with pytest.raises(InvalidRequest) as parsed:
            _url.parse_url(url)
        assert str(refused.value) == f"code tool config: sandbox_fusion_url: {parsed.value}"
    elif url.startswith("http"):
        assert not ToolSettings.from_config(config).in_micro_vms
    else:
        with pytest.raises(ValueError, match=r"is neither hyperlight://\.\.\. nor an http"):
            ToolSettings.from_config(config)
