"""The deployment examples for `verl-hyperlight serve` are valid and agree with the server: a
Kubernetes Deployment and Service (YAML), and a systemd unit (checked by systemd-analyze where
it exists)."""

from __future__ import annotations

import configparser
import json
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
    command = container["command"]
    assert command[:2] == ["verl-hyperlight", "serve"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/v1/ping"
    assert "devices.kubevirt.io/kvm" in container["resources"]["limits"]
    # The pod outlives the server's grace period, so cases in flight can finish.
    assert pod["terminationGracePeriodSeconds"] > grace(command)
    port = next(a for a in command if a.startswith("--port=")).split("=")[1]
    assert container["ports"][0]["containerPort"] == int(port)
    service = kinds["Service"]["spec"]
    assert service["selector"] == kinds["Deployment"]["spec"]["selector"]["matchLabels"]


def test_the_dockerfile_builds_the_server_from_this_checkout() -> None:
    lines = (EXAMPLES / "Dockerfile").read_text().splitlines()
    instructions = [line.split()[0] for line in lines if line and not line.startswith((" ", "#"))]
    assert instructions[0] == "FROM" and instructions[-1] == "ENTRYPOINT"
    assert set(instructions) <= {
        "FROM",
        "RUN",
        "USER",
        "WORKDIR",
        "ENV",
        "COPY",
        "EXPOSE",
        "ENTRYPOINT",
    }
    text = "\n".join(lines)
    assert "raw.githubusercontent.com/hyperlight-dev/hyperlight-unikraft/main/install.sh" in text
    assert "src[serve,cli]" in text  # this checkout, not a package of the same name elsewhere
    entrypoint = json.loads(lines[-1].split(" ", 1)[1])
    assert entrypoint[:2] == ["verl-hyperlight", "serve"]


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
