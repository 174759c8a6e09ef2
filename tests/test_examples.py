"""The deployment examples for `verl-hyperlight serve` are valid and agree with the server: a
Kubernetes Deployment and Service (YAML), and a systemd unit (checked by systemd-analyze where
it exists)."""

from __future__ import annotations

import configparser
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def grace(arguments: list[str]) -> float:
    """The --grace an argument list gives the server (its default, 30, if none)."""
    for index, argument in enumerate(arguments):
        if argument.startswith("--grace="):
            return float(argument.split("=", 1)[1])
        if argument == "--grace":
            return float(arguments[index + 1])
    return 30.0


def test_the_kubernetes_example_is_a_deployment_and_a_service_of_the_server() -> None:
    documents = list(yaml.safe_load_all((EXAMPLES / "kubernetes.yaml").read_text()))
    kinds = {document["kind"]: document for document in documents}
    assert set(kinds) == {"Deployment", "Service"}
    pod = kinds["Deployment"]["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert container["command"][:2] == ["verl-hyperlight", "serve"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/v1/ping"
    assert "devices.kubevirt.io/kvm" in container["resources"]["limits"]
    # The pod outlives the server's grace period, so cases in flight can finish.
    assert pod["terminationGracePeriodSeconds"] > grace(container["command"])
    port = next(a for a in container["command"] if a.startswith("--port=")).split("=")[1]
    assert container["ports"][0]["containerPort"] == int(port)
    service = kinds["Service"]["spec"]
    assert service["selector"] == kinds["Deployment"]["spec"]["selector"]["matchLabels"]


def unit() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read(EXAMPLES / "verl-hyperlight.service")
    return parser


def test_the_systemd_unit_stops_the_server_alone_after_its_grace() -> None:
    service = unit()["Service"]
    command = service["ExecStart"].split()
    assert command[1] == "serve" and command[0].endswith("/verl-hyperlight")
    assert service["KillMode"] == "mixed"
    assert float(service["TimeoutStopSec"]) > grace(command)


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze here")
def test_the_systemd_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    text = (EXAMPLES / "verl-hyperlight.service").read_text()
    # The programs it names are the node's: here, stand-ins that exist.
    text = re.sub(r"ExecStart=\S+", "ExecStart=/bin/true", text)
    copy = tmp_path / "verl-hyperlight.service"
    copy.write_text(text)
    done = subprocess.run(
        ["systemd-analyze", "verify", str(copy)], capture_output=True, text=True, timeout=60
    )
    complaints = [line for line in done.stderr.splitlines() if str(copy) in line]
    assert done.returncode == 0 and complaints == [], done.stderr
