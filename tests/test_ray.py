"""hyperlight://?ray on a real multi-node Ray cluster on this machine (ray.cluster_utils): a
head node without the resource, whose hluk fails loudly and says so if anything runs there, and
nodes that offer it, each with its own stand-in hluk cache, argv log and case-directory root,
so that a test can tell which node ran a case. One cluster for the module: a node takes ~10 s to
start here. Needs Ray (the verl leg of CI has it, with verl); the test of a worker without Ray
runs everywhere.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from conftest import find_bwrap
from hostside import (
    WaitingCase,
    logged_argvs,
    processes_running,
    processes_with,
    result,
    sandbox_error,
    wait_for,
)

from verl_hyperlight import run_code
from verl_hyperlight.cancel import POLL_SECONDS, Cancel
from verl_hyperlight.case import cluster as _cluster
from verl_hyperlight.errors import BackendError

ROOT = Path(__file__).resolve().parent.parent

# The head's hluk: a case or warm-up there is a failure the test sees, in its answer and log.
HEAD_HLUK = """#!/bin/sh
echo "$*" >> {log}
echo "hluk on the Ray head node: no case may run here" >&2
exit 97
"""


@dataclass
class Node:
    """A node that offers a resource, as a test sees it."""

    name: str
    root: Path
    handle: Any = None
    resources: dict[str, float] = field(default_factory=dict)

    @property
    def argv_log(self) -> Path:
        return self.root / "argv.log"

    @property
    def case_root(self) -> Path:
        return self.root / "cases"

    def case_runs(self) -> int:
        """The case runs its hluk has started (warm-ups mount no case directory)."""
        return sum("--mount" in argv for argv in logged_argvs(self.argv_log))

    def running(self) -> list[int]:
        """Its hluk processes running a case now: not the child a stand-in hluk forks for its
        guest, which shows the hluk's argv until it execs (its preexec_fn runs first)."""
        hluks = processes_with("/standin/hluk\0")
        return [pid for pid in processes_running(str(self.case_root)) if pid in hluks]


class RayCluster:
    def __init__(self, root: Path, standin: Path) -> None:
        import ray
        from ray.cluster_utils import Cluster

        self.ray = ray
        self.root = root
        self.standin = standin
        self.head_log = root / "head.log"
        head_hluk = root / "head-hluk"
        head_hluk.write_text(HEAD_HLUK.format(log=self.head_log))
        head_hluk.chmod(0o755)
        self.cluster = Cluster(
            initialize_head=True,
            connect=False,
            head_node_args={
                "num_cpus": 1,
                "include_dashboard": False,
                "env_vars": {"HLUK_PATH": str(head_hluk)},
            },
        )
        self.nodes: dict[str, Node] = {}

    def add(self, name: str, resources: dict[str, float], ready_guests: str = "0") -> Node:
        """A node offering `resources`. Its cases each start their own hluk (ready guests off,
        unless `ready_guests`): these tests count each node's hluk runs per case."""
        node = Node(name, self.root / name, resources=resources)
        node.case_root.mkdir(parents=True)
        env = {
            "HLUK_PATH": str(self.standin),
            "HLUK_CACHE_DIR": str(node.root / "cache"),
            "HLUK_STANDIN_BWRAP": find_bwrap(),
            "HLUK_STANDIN_ARGV_LOG": str(node.argv_log),
            "VERL_HYPERLIGHT_HLUK_ENV": "HLUK_STANDIN_*",
            "VERL_HYPERLIGHT_CASE_DIR": str(node.case_root),
            "VERL_HYPERLIGHT_READY_GUESTS": ready_guests,
        }
        node.handle = self.cluster.add_node(num_cpus=1, resources=resources, env_vars=env)
        self.cluster.wait_for_nodes()
        self.nodes[name] = node
        return node

    def remove(self, node: Node, graceful: bool = True) -> None:
        self.cluster.remove_node(node.handle, allow_graceful=graceful)
        del self.nodes[node.name]

    def shutdown(self) -> None:
        self.ray.shutdown()
        self.cluster.shutdown()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, standin_path: Path) -> Iterator[RayCluster]:
    pytest.importorskip("ray", reason="Ray is not installed: pip install -e '.[ray]'")
    # Ray's sockets and logs in a directory of the module's own (a socket path stays short).
    ray_tmp = tempfile.mkdtemp(prefix="/tmp/vh-ray-")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RAY_TMPDIR", ray_tmp)
        patch.delenv("RAY_ADDRESS", raising=False)
        built = RayCluster(tmp_path_factory.mktemp("cluster"), standin_path)
        try:
            if built.ray.is_initialized():  # by an earlier module's test, on a cluster of its own
                built.ray.shutdown()
            built.add("a", {"hyperlight": 3})
            built.add("b", {"hyperlight": 3})
            built.ray.init(address=built.cluster.address)
            yield built
        finally:
            built.shutdown()
    subprocess.run(["rm", "-rf", ray_tmp], check=False)


def through(
    url: str, code: str, stdin: str = "", run_timeout: float = 20, **options: Any
) -> dict[str, Any]:
    response, error = run_code(url, code, stdin, None, run_timeout, None, **options)
    assert error is None and response is not None, error
    return response


SQUARE = "import sys\nprint(int(sys.stdin.read()) ** 2)\n"


def test_hundreds_of_cases_from_several_threads_run_on_the_nodes_that_offer_the_resource(
    cluster: RayCluster,
) -> None:
    a, b = cluster.nodes["a"], cluster.nodes["b"]
    before = a.case_runs() + b.case_runs()
    with ThreadPoolExecutor(12) as pool:
        answers = list(pool.map(lambda i: through("hyperlight://?ray", SQUARE, str(i)), range(240)))
    for i, answer in enumerate(answers):
        assert result(answer)[:4] == ("Success", "Finished", 0, f"{i * i}\n"), answer
    assert a.case_runs() + b.case_runs() - before == 240
    assert a.case_runs() and b.case_runs()  # Ray spread them
    assert not cluster.head_log.exists()  # nothing ran on the head


def test_large_inputs_and_outputs_cross_the_cluster_whole(cluster: RayCluster) -> None:
    import base64

    stdin = "x" * (1024 * 1024)
    data = os.urandom(2 * 1024 * 1024)
    size = 16 * 1024 * 1024 - 1024
    code = (
        "import sys\n"
        "data = open('in.bin', 'rb').read()\n"
        "open('out.bin', 'wb').write(data[::-1])\n"
        f"sys.stdout.write('y' * {size})\n"
        "sys.stderr.write(str(len(sys.stdin.read())))\n"
    )
    answer = through(
        "hyperlight://?ray",
        code,
        stdin,
        run_timeout=60,
        files={"in.bin": base64.b64encode(data).decode()},
        fetch_files=["out.bin"],
    )
    status, run_status, code_status, stdout, stderr = result(answer)
    assert (status, run_status, code_status) == ("Success", "Finished", 0), answer["message"]
    assert stdout == "y" * size and stderr == str(len(stdin))
    assert base64.b64decode(answer["files"]["out.bin"]) == data[::-1]


def pending_demand(cluster: RayCluster, resource: str) -> int:
    """The demand for `resource` Ray's autoscaler sees now: what `ray status` lists as Pending
    Demands, read from the cluster's control store as the autoscaler reads it."""
    from ray.autoscaler.v2.sdk import get_cluster_status

    status = get_cluster_status(cluster.ray.get_runtime_context().gcs_address, timeout=10)
    return sum(
        int(by_count.count)
        for demand in status.resource_demands.ray_task_actor_demand
        for by_count in demand.bundles_by_count
        if resource in by_count.bundle
    )


def test_while_no_node_offers_the_resource_cases_wait_where_the_autoscaler_sees_them(
    cluster: RayCluster, caplog: pytest.LogCaptureFixture
) -> None:
    """A KVM group scaled to zero: the cases stay pending, their demand in Ray's own state the
    whole time (20 s here), and run on the node that joins, as an autoscaler would add it."""
    caplog.set_level(logging.WARNING, "verl_hyperlight")
    url = "hyperlight://?ray=scaled"
    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(through, url, SQUARE, str(i)) for i in range(4)]
        assert wait_for(lambda: pending_demand(cluster, "scaled") == 4, limit=30)
        seen = []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            seen.append(pending_demand(cluster, "scaled"))
            time.sleep(2)
        assert set(seen) == {4} and not any(future.done() for future in futures)
        joined = cluster.add("scaled", {"scaled": 2})
        try:
            answers = [future.result(timeout=120) for future in futures]
            assert joined.case_runs() == 4
        finally:
            cluster.remove(joined)
    assert [result(answer)[3] for answer in answers] == [f"{i * i}\n" for i in range(4)]
    assert wait_for(lambda: pending_demand(cluster, "scaled") == 0, limit=30)
    said = [m for r in caplog.records if "'scaled'" in (m := r.getMessage())]
    assert len(said) == 1 and "its cases wait for one, up to 300 s each" in said[0]


def test_a_case_that_waits_out_its_wait_is_a_sandbox_error_its_demand_withdrawn(
    cluster: RayCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VERL_HYPERLIGHT_RAY_WAIT", "3")
    url = "hyperlight://?ray=absent"
    for _ in range(2):  # each case waits, pending: none is answered at once
        started = time.monotonic()
        message = sandbox_error(through(url, "print(1)"))
        assert time.monotonic() - started >= 3
        assert (
            "no alive node of the Ray cluster offers the resource 'absent' (waited 3 s, "
            "VERL_HYPERLIGHT_RAY_WAIT)" in message
        )
        assert """ray start --address=HEAD:6379 --resources='{"absent": N}'""" in message
    assert wait_for(lambda: pending_demand(cluster, "absent") == 0, limit=30)


def test_a_node_with_ready_guests_runs_its_cases_in_them(cluster: RayCluster) -> None:
    url = "hyperlight://?ray=warmish"
    node = cluster.add("warmish", {"warmish": 2}, ready_guests="4")
    try:
        answers = []
        for i in range(5):
            answers.append(through(url, SQUARE, str(i)))
            time.sleep(0.5)  # the next case's guest starts meanwhile
        runs = [json.loads(line) for line in node.argv_log.read_text().splitlines()]
        execs = [argv[argv.index("--exec") + 1] for argv in runs if "--exec" in argv]
        own = sum(".main(" in code for code in execs)
        assert sum(".await_case(" in code for code in execs) >= 1 and own < 5, execs
    finally:
        cluster.remove(node)
    assert [result(answer)[3] for answer in answers] == [f"{i * i}\n" for i in range(5)]


def test_a_node_that_joins_mid_batch_takes_the_cases_that_wait(cluster: RayCluster) -> None:
    url = "hyperlight://?ray=joining"
    with ThreadPoolExecutor(6) as pool:
        futures = [pool.submit(through, url, SQUARE, str(i)) for i in range(6)]
        time.sleep(1)
        assert not any(future.done() for future in futures)  # waiting: nobody offers it yet
        joined = cluster.add("joined", {"joining": 3})
        try:
            answers = [future.result(timeout=120) for future in futures]
            assert joined.case_runs() == 6
        finally:
            cluster.remove(joined)
    assert [result(answer)[3] for answer in answers] == [f"{i * i}\n" for i in range(6)]


def test_a_node_removed_mid_batch_fails_only_the_cases_it_had_started(
    cluster: RayCluster,
) -> None:
    url = "hyperlight://?ray=doomed"
    doomed = cluster.add("doomed", {"doomed": 2})
    spare = cluster.add("spare", {"doomed": 2})
    sleeper = "import sys, time\ntime.sleep(4)\nprint(sys.stdin.read())\n"
    try:
        with ThreadPoolExecutor(8) as pool:
            futures = [pool.submit(through, url, sleeper, str(i)) for i in range(8)]
            # Both units' hluks running, and each past its start (logged): a stand-in hluk is a
            # Python that takes a moment to reach its main, and one killed before then would
            # leave a started case unlogged (CI at 915a4ed).
            assert wait_for(
                lambda: len(doomed.running()) == 2 and doomed.case_runs() == 2, limit=60
            )
            cluster.remove(doomed, graceful=False)
            answers = [future.result(timeout=120) for future in futures]
        started_there = doomed.case_runs()
        failed = [answer for answer in answers if answer["status"] == "SandboxError"]
        assert len(failed) == started_there == 2, [a["message"] for a in failed]
        # Ray's NodeDiedError, or, when the node's worker saw its micro-VM killed with the node
        # and answered before it died itself, that worker's own answer: a death either way.
        assert all("died" in sandbox_error(a) for a in failed), [a["message"] for a in failed]
        for i, answer in enumerate(answers):
            if answer["status"] != "SandboxError":
                assert result(answer)[:4] == ("Success", "Finished", 0, f"{i}\n")
        assert spare.case_runs() == 6
    finally:
        cluster.remove(spare)


def test_a_cancelled_case_kills_its_micro_vm_on_its_node(cluster: RayCluster) -> None:
    cancel = threading.Event()
    a, b = cluster.nodes["a"], cluster.nodes["b"]
    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(
            through,
            "hyperlight://?ray",
            "import time\ntime.sleep(60)\n",
            run_timeout=90,
            cancel=cancel,
        )
        assert wait_for(lambda: a.running() or b.running(), limit=60)
        running = a.running() + b.running()
        cancel.set()
        message = sandbox_error(future.result(timeout=30))
    assert "cancelled" in message
    assert wait_for(lambda: not (set(a.running() + b.running()) & set(running)), limit=30)


@pytest.mark.parametrize("kind", ["Cancel", "plain Event"])
def test_a_case_waiting_for_a_node_sleeps_until_its_cancel_wakes_it(
    cluster: RayCluster, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """A case pending while no node offers its resource: its thread wakes only to look at the
    resource's presence, once a second (cluster.PRESENCE_SECONDS), and a Cancel's set wakes it
    at once, its task withdrawn; a plain Event, which can wake no one, is looked at every
    cancel.POLL_SECONDS. (When it waited in Ray's `get` for a tenth of a second at a time, its
    thread woke 78-80 times in these 4 s with either.)"""
    monkeypatch.setenv("VERL_HYPERLIGHT_RAY_WAIT", "300")
    resource = f"idle{kind[0]}"
    cancel = Cancel() if kind == "Cancel" else threading.Event()
    case = WaitingCase("print(1)", cancel, url=f"hyperlight://?ray={resource}")
    assert wait_for(lambda: pending_demand(cluster, resource) == 1, limit=30)
    woke = case.wake_ups(4)
    print(f"{kind}: the waiting case's thread woke {woke} times in 4 s")
    assert "cancelled" in case.cancelled()
    assert wait_for(lambda: pending_demand(cluster, resource) == 0, limit=30)
    if kind == "Cancel":  # a look is a wait for Ray's control store too
        assert woke <= 3 * 4
    else:
        assert woke >= 4 / POLL_SECONDS - 2


def test_hundreds_of_waiting_cases_look_at_the_resource_once_a_second_between_them(
    cluster: RayCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch's trajectories pending on a group scaled to zero: 128 cases of one process wait
    for a node, and one look at Ray's control store a second answers them all (each case that
    looked itself made 128 a second here); each thread still wakes about once a second, for
    its own RAY_WAIT clock. One Cancel ends them all, their demand withdrawn."""
    monkeypatch.setenv("VERL_HYPERLIGHT_RAY_WAIT", "300")
    resource, count, seconds = "crowd", 128, 4
    looks: list[float] = []
    units = _cluster._connection.units

    def counted(name: str) -> float:
        if name == resource:
            looks.append(time.monotonic())
        return units(name)

    monkeypatch.setattr(_cluster._connection, "units", counted)
    cancel = Cancel()
    cases = [
        WaitingCase("print(1)", cancel, url=f"hyperlight://?ray={resource}") for _ in range(count)
    ]
    try:
        assert wait_for(lambda: pending_demand(cluster, resource) == count, limit=60)
        looks.clear()
        before = sum(case.switches() for case in cases)
        time.sleep(seconds)
        woke = sum(case.switches() for case in cases) - before
        made = len(looks)
        print(
            f"{count} waiting cases: {made} looks at the resource, {woke} wake-ups in {seconds} s"
        )
    finally:
        cancel.set()
        for case in cases:
            case.thread.join(60)
    assert all(
        "cancelled" in sandbox_error(response) for case in cases for response, _ in case.answers
    )
    assert sum(len(case.answers) for case in cases) == count
    assert wait_for(lambda: pending_demand(cluster, resource) == 0, limit=60)
    assert 1 <= made <= seconds / _cluster.PRESENCE_SECONDS + 2
    assert woke <= count * 3 * seconds


def test_the_agent_tools_stateless_calls_take_the_cluster(cluster: RayCluster) -> None:
    import asyncio

    from verl_hyperlight.agent.calls import CodeRunner, ToolSettings

    a, b = cluster.nodes["a"], cluster.nodes["b"]
    before = a.case_runs() + b.case_runs()
    runner = CodeRunner(ToolSettings.from_config({"sandbox_fusion_url": "hyperlight://?ray"}))

    async def calls() -> list[Any]:
        return await asyncio.gather(*(runner.call({"code": f"print({i} * 3)"}) for i in range(8)))

    said = asyncio.run(calls())
    assert [text for text, _ in said] == [f"{i * 3}\n" for i in range(8)]
    assert a.case_runs() + b.case_runs() - before == 8


WITHOUT_RAY = """
import sys
sys.modules["ray"] = None  # an environment without the ray extra
from verl_hyperlight import run_code
response, error = run_code("hyperlight://?ray", "print(1)", "", None, 5, None)
print(response["status"], response["message"])
"""

UNREACHABLE = """
import sys
from verl_hyperlight import run_code
response, error = run_code("hyperlight://?ray", "print(1)", "", None, 5, None)
print(response["status"], response["message"])
"""


class JustTheResources:
    """What a case's wait asks of Ray about a cluster offering `units` of "fake", `free` of
    them free now, and a reference that is never answered (its future never done)."""

    def __init__(self, units: float, free: float) -> None:
        self.units, self.free = units, free

    def cluster_resources(self) -> dict[str, float]:
        return {"fake": self.units}

    def available_resources(self) -> dict[str, float]:
        return {"fake": self.free}

    def future(self) -> Future[Any]:
        return Future()


@pytest.mark.parametrize(("free", "cause"), [(2, "ray-actor-slow"), (0, "ray-units-held")])
def test_an_actor_not_up_in_time_is_said_slow_to_start_when_units_were_free(
    free: float, cause: str
) -> None:
    """A notebook's actor not up within its start-up deadline while nodes offer the resource:
    with units free, Ray was slow to start its worker (CI's load once took one past 4 s, which
    was said as every unit held); with none free, the units are held. Runs without Ray."""
    connection = _cluster._Connection()
    connection._ray = fake = JustTheResources(units=3, free=free)
    stopped: list[bool] = []
    with pytest.raises(BackendError) as raised:
        connection.wait(fake, "fake", None, "cancelled", lambda: stopped.append(True), 0.3)
    assert raised.value.cause == cause and stopped == [True]
    said = str(raised.value)
    if free:
        assert "although 2 of the 3 units of 'fake' the cluster offers were free" in said
        assert "VERL_HYPERLIGHT_STARTUP_TIMEOUT" in said
    else:
        assert "no unit of 'fake' came free for a notebook within 0 s: all 3" in said


class SlowResourceView:
    """Ray's resource view of a cluster where no node offers "fake", each look taking 50 ms
    (a loaded control store), the looks counted."""

    def __init__(self) -> None:
        self.looks = 0

    def cluster_resources(self) -> dict[str, float]:
        self.looks += 1
        time.sleep(0.05)
        return {}


def test_cases_that_look_at_once_share_one_look_at_the_resource(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """64 waiting cases due to look at the same moment, none offered: one asks Ray, the
    others take its answer, as they do for PRESENCE_SECONDS; then one looks again. Runs
    without Ray. (PRESENCE_SECONDS is made long: a loaded machine's slow thread is not a
    case due to look again.)"""
    monkeypatch.setattr(_cluster, "PRESENCE_SECONDS", 60.0)
    connection = _cluster._Connection()
    connection._ray = fake = SlowResourceView()
    go = threading.Barrier(64)

    def look() -> bool:
        go.wait()
        return connection.offered("fake", time.monotonic())

    with ThreadPoolExecutor(64) as pool:
        seen = list(pool.map(lambda _: look(), range(64)))
    assert seen == [False] * 64 and fake.looks == 1
    assert not connection.offered("fake", time.monotonic()) and fake.looks == 1
    later = time.monotonic() + _cluster.PRESENCE_SECONDS
    assert not connection.offered("fake", later) and fake.looks == 2


def test_a_worker_without_ray_is_told_which_extra_to_install() -> None:
    said = subprocess.run(
        [sys.executable, "-c", WITHOUT_RAY], capture_output=True, text=True, timeout=60
    )
    assert said.stdout.startswith("SandboxError the sandbox URL asks for Ray (?ray)"), said
    assert "pip install -e '.[ray]' in your verl-hyperlight checkout" in said.stdout
    assert "every code reward" in said.stderr  # logged once at ERROR, as a broken backend is


def test_a_worker_that_reaches_no_cluster_is_told_how_to_reach_one(tmp_path: Path) -> None:
    pytest.importorskip("ray", reason="Ray is not installed: pip install -e '.[ray]'")
    env = {**os.environ, "RAY_ADDRESS": "127.0.0.1:9", "RAY_TMPDIR": str(tmp_path)}
    said = subprocess.run(
        [sys.executable, "-c", UNREACHABLE], capture_output=True, text=True, timeout=120, env=env
    )
    assert said.stdout.startswith("SandboxError the sandbox URL asks for Ray (?ray) and no Ray"), (
        said
    )
    assert "set RAY_ADDRESS" in said.stdout
    # Not a bare `ray start --head`, which offers no resource, so cases would wait 60 s on it.
    assert """`ray start --head --resources='{"hyperlight": N}'`""" in said.stdout


GOOD = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
BAD = "```python\na, b = map(int, input().split())\nprint(a - b)\n```"
# The reward config of the docs' page on GPU nodes without KVM (docs/ray.md; test_readme checks
# the page shows this one).
RAY_REWARD_CONFIG = {"url": "hyperlight://?ray", "max_concurrent": 64, "memory_limit_mb": 1024}


def test_verls_reward_loop_scores_a_batch_through_the_cluster(
    cluster: RayCluster, tmp_path: Path
) -> None:
    """verl's own RewardLoopManager, its reward workers placed by verl (on the head too, whose
    hluk fails), scoring codecontests samples with reward.sandbox_fusion.url=hyperlight://?ray:
    every case runs on a node that offers the resource."""
    pytest.importorskip("verl", reason="verl is not installed: pip install torch verl")
    import numpy as np
    import torch
    from omegaconf import OmegaConf
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from verl import DataProto
    from verl.experimental.reward_loop.reward_loop import RewardLoopManager

    # A tokenizer of our own, offline, whose tokens 6 and 7 decode to a right and a wrong
    # solution: no model, no GPU.
    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2, "p": 3, "q": 4, "r": 5, GOOD: 6, BAD: 7}
    words = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(
        tokenizer_object=words, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>"
    ).save_pretrained(tmp_path / "tokenizer")
    config = OmegaConf.create(
        {
            "actor_rollout_ref": {
                "model": {"path": str(tmp_path / "tokenizer"), "tokenizer_path": None}
            },
            "reward": {
                "num_workers": 2,
                "reward_model": {
                    "enable": False,
                    "enable_resource_pool": False,
                    "model_path": None,
                },
                "reward_manager": {
                    "name": "naive",
                    "source": "register",
                    "module": {"path": None, "name": None},
                },
                "custom_reward_function": {"path": None, "name": None, "reward_kwargs": {}},
                "sandbox_fusion": RAY_REWARD_CONFIG,
            },
        }
    )
    a, b = cluster.nodes["a"], cluster.nodes["b"]
    before = a.case_runs() + b.case_runs()
    tests = json.dumps({"inputs": ["1 2\n", "3 4\n"], "outputs": ["3\n", "7\n"]})
    rows = 4
    data = DataProto.from_dict(
        tensors={
            "prompts": torch.tensor([[3, 4, 5]] * rows),
            "responses": torch.tensor([[6, 1], [7, 1], [6, 1], [7, 1]]),
            "attention_mask": torch.ones(rows, 5, dtype=torch.long),
        },
        non_tensors={
            "data_source": np.array(["codecontests"] * rows, dtype=object),
            "reward_model": np.array([{"ground_truth": tests}] * rows, dtype=object),
        },
    )
    scores = RewardLoopManager(config).compute_rm_score(data).batch["rm_scores"].sum(-1)
    assert scores.tolist() == [1.0, 0.0, 1.0, 0.0]
    assert a.case_runs() + b.case_runs() - before >= 6  # 2 tests each (a wrong one may stop at 1)
    assert not cluster.head_log.exists()


def test_doctor_lists_the_nodes_that_offer_the_resource_and_checks_each_there(
    cluster: RayCluster,
) -> None:
    from verl_hyperlight.commands import doctor

    # The first run takes each node's warm snapshot if it has none (warn: a first case would
    # wait); the next finds every node warm.
    list(doctor.checks(doctor.Options(url="hyperlight://?ray")))
    found = list(doctor.checks(doctor.Options(url="hyperlight://?ray")))
    by_name: dict[str, list[doctor.Check]] = {}
    for check in found:
        by_name.setdefault(check.name, []).append(check)
    nodes = by_name["nodes"]
    assert nodes[0].status == "ok" and "2 alive node(s) offer 'hyperlight'" in nodes[0].detail
    ids = {node["NodeID"][:8] for node in cluster.ray.nodes()}
    # Each node's own hluk, warm guest and case end to end, said with the node's id.
    for name in ("hluk", "snapshot", "case"):
        assert len(by_name[name]) == 2 and all(c.status == "ok" for c in by_name[name]), found
        assert len({c.detail.split("]")[0] for c in by_name[name]}) == 2
        assert all(c.detail.split("]")[0].split()[-1] in ids for c in by_name[name])
    assert all("print(1+1) answered 2" in c.detail for c in by_name["case"])
    assert not cluster.head_log.exists()

    missing = list(doctor.checks(doctor.Options(url="hyperlight://?ray=nobody")))
    failed = [check for check in missing if check.status == "fail"]
    assert [check.name for check in failed] == ["nodes"]
    assert "ray start --address=HEAD:6379" in failed[0].fix


def test_bench_measures_through_the_cluster(
    cluster: RayCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    from verl_hyperlight.cli import main

    a, b = cluster.nodes["a"], cluster.nodes["b"]
    before = a.case_runs() + b.case_runs()
    argv = ["bench", "hyperlight://?ray", "--concurrency", "1,4", "--seconds", "1", "--json"]
    assert main(argv) == 0
    levels = json.loads(capsys.readouterr().out)["levels"]
    assert [level["concurrency"] for level in levels] == [1, 4]
    assert all(level["failed"] == 0 and level["cases"] > 0 for level in levels), levels
    ran = sum(level["cases"] for level in levels)
    assert a.case_runs() + b.case_runs() - before >= ran  # every measured case ran on a node
    assert not cluster.head_log.exists()


def readme_section() -> str:
    """The docs' page on GPU nodes without KVM (docs/ray.md)."""
    return (ROOT / "docs" / "ray.md").read_text()


def fenced(section: str) -> list[tuple[str, str]]:
    """The section's fenced blocks: (language, text)."""
    blocks, parts = [], section.split("```")
    for block in parts[1:-1:2]:
        language, _, body = block.partition("\n")
        blocks.append((language.strip(), body))
    return blocks


def test_the_readmes_ray_section_shows_the_config_and_resource_the_tests_use() -> None:
    import shlex

    import yaml

    from verl_hyperlight.case.url import DEFAULT_RESOURCE, parse_url

    (_, keys), (_, start), (language, kuberay) = fenced(readme_section())
    command = shlex.split(keys.replace("\\\n", " "))
    assert command[:4] == ["python", "-m", "verl.trainer.main_ppo", "..."]
    shown: dict[str, Any] = {}
    for override in command[4:]:
        name, _, value = override.removeprefix("reward.sandbox_fusion.").partition("=")
        shown[name] = int(value) if value.isdigit() else value
    assert shown == RAY_REWARD_CONFIG  # the config test_verls_reward_loop_... scores with
    assert parse_url(shown["url"]).ray == DEFAULT_RESOURCE == "hyperlight"
    # `ray start` offering the resource the cluster fixture's nodes offer.
    argv = shlex.split(start)
    assert argv[:3] == ["ray", "start", "--address=HEAD:6379"]
    resources = json.loads(argv[3].removeprefix("--resources="))
    assert list(resources) == [DEFAULT_RESOURCE] and resources[DEFAULT_RESOURCE] > 0
    # KubeRay's rayStartParams hold the same, in its quoting (a JSON string in YAML quotes).
    assert language == "yaml"
    group = yaml.safe_load(kuberay)["workerGroupSpecs"][0]
    assert json.loads(json.loads(group["rayStartParams"]["resources"])) == resources
    spec = group["template"]["spec"]
    assert spec["volumes"][0]["hostPath"]["path"] == "/dev/kvm"


def notebook_hluks(node: Node) -> list[int]:
    """Its hluk processes that run a notebook (a notebook mounts no case directory)."""
    return [
        pid
        for pid in processes_running(".notebook(")  # not the child it forks for its guest
        if pid in processes_with("/standin/hluk\0")
        and f"HLUK_CACHE_DIR={node.root / 'cache'}".encode() in environ_of(pid)
    ]


def environ_of(pid: int) -> list[bytes]:
    """A process's environment; none once it has exited (it may, between listing and reading)."""
    try:
        return Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return []


def test_a_trajectorys_notebook_lives_on_one_node_and_ends_when_released(
    cluster: RayCluster,
) -> None:
    import asyncio

    from verl_hyperlight.agent.calls import NOTEBOOK_RESTARTED, CodeRunner, ToolSettings

    a, b = cluster.nodes["a"], cluster.nodes["b"]
    config = {"sandbox_fusion_url": "hyperlight://?ray", "session": "trajectory"}
    runner = CodeRunner(ToolSettings.from_config(config))

    def ask(code: str, key: str, **parameters: Any) -> tuple[str, dict[str, Any]]:
        return asyncio.run(runner.call({"code": code, **parameters}, key))

    try:
        assert ask("x = 41", "t1")[0] == ""
        assert ask("y = 1", "t2")[0] == ""
        for _ in range(3):
            assert ask("x += 1\nprint(x)", "t1")[0] in ("42\n", "43\n", "44\n")
        assert ask("print(x)", "t1")[0] == "44\n"  # state kept across calls
        assert "NameError" in ask("print(x)", "t2")[0]  # each trajectory its own
        up = notebook_hluks(a) + notebook_hluks(b)
        assert len(up) == 2 and not cluster.head_log.exists()
        # A call past its time limit ends the notebook, and its answer says so.
        text, found = ask("import time\ntime.sleep(30)", "t1", timeout=1)
        assert text.endswith(NOTEBOOK_RESTARTED) and found["session_restarted"] is True
        assert "NameError" in ask("print(x)", "t1")[0]
        runner.release("t1")
        runner.release("t2")
        assert wait_for(lambda: not (notebook_hluks(a) + notebook_hluks(b)), limit=30)
    finally:
        runner.close()


def test_a_cancelled_notebook_call_kills_its_actor_and_micro_vm(cluster: RayCluster) -> None:
    from verl_hyperlight.agent.notebook import RemoteNotebook

    a, b = cluster.nodes["a"], cluster.nodes["b"]
    notebook = RemoteNotebook("hyperlight://?ray", None)
    response, _ = notebook.run("x = 1\nprint(x)", 10, None)
    assert response is not None and result(response)[3] == "1\n" and notebook.alive
    [hluk] = notebook_hluks(a) + notebook_hluks(b)
    cancel = threading.Event()
    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(notebook.run, "import time\ntime.sleep(60)", 90, cancel)
        time.sleep(1)
        cancel.set()
        response, _ = future.result(timeout=30)
    assert response is not None and "cancelled" in sandbox_error(response)
    assert not notebook.alive and notebook.actor is None
    assert wait_for(lambda: hluk not in notebook_hluks(a) + notebook_hluks(b), limit=30)
    response, _ = notebook.run("print(2)", 10, None)  # a new actor, a new micro-VM
    assert response is not None and result(response)[3] == "2\n" and notebook.generation == 2
    notebook.close()
    assert wait_for(lambda: not notebook_hluks(a) + notebook_hluks(b), limit=30)


def test_trajectories_past_the_clusters_units_are_answered_and_those_holding_units_run_on(
    cluster: RayCluster, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """One unit, one tool thread, room for eight notebooks (what deadlocked: a new trajectory's
    first call held the only thread waiting for a unit the first trajectory held, whose next
    call then waited for the thread). Each newcomer is answered within the start-up deadline,
    saying what is full; the first trajectory's call runs after them, its state kept."""
    import asyncio

    from verl_hyperlight.agent.calls import CodeRunner, ToolSettings

    caplog.set_level(logging.WARNING, "verl_hyperlight")
    tight = cluster.add("tight", {"tight": 1})
    config = {
        "sandbox_fusion_url": "hyperlight://?ray=tight",
        "session": "trajectory",
        "num_workers": 1,
        "max_sessions": 8,
    }
    runner = CodeRunner(ToolSettings.from_config(config))

    def ask(code: str, key: str) -> tuple[str, dict[str, Any]]:
        return asyncio.run(runner.call({"code": code}, key))

    try:
        # The holder's actor is the new node's first: its Ray worker starts within the default
        # deadline (CI's load once took it past 4 s); the newcomers', placed nowhere, within 4 s.
        assert ask("x = 1\nprint(x)", "holder")[0] == "1\n"
        monkeypatch.setenv("VERL_HYPERLIGHT_STARTUP_TIMEOUT", "4")
        with ThreadPoolExecutor(4) as pool:
            newcomers = [pool.submit(ask, "print('in')", f"new{i}") for i in range(3)]
            holder = pool.submit(ask, "x += 1\nprint(x)", "holder")
            answers = [future.result(timeout=120) for future in newcomers]
            assert holder.result(timeout=120)[0] == "2\n"
        assert all(found["status"] == "SandboxError" for _, found in answers)
        said = [m for r in caplog.records if "no unit of 'tight'" in (m := r.getMessage())]
        assert said and "all 1 the cluster offers are held by notebooks and cases" in said[0]
        assert "lower the code tool's max_sessions" in said[0]
        assert ask("print(x)", "holder")[0] == "2\n"  # its state all along
        assert wait_for(lambda: pending_demand(cluster, "tight") == 0, limit=30)  # withdrawn
    finally:
        runner.close()
        cluster.remove(tight)


def test_max_sessions_with_ray_follows_the_units_the_cluster_offers(
    cluster: RayCluster, caplog: pytest.LogCaptureFixture
) -> None:
    from verl_hyperlight.agent.calls import ToolSettings

    def sized(url: str, num_workers: int) -> int:
        config = {"sandbox_fusion_url": url, "session": "trajectory", "num_workers": num_workers}
        return ToolSettings.from_config(config).max_sessions

    many = cluster.add("many", {"many": 24})
    try:
        assert sized("hyperlight://?ray=many", 1) == 24 // 8  # shared by verl's 8 loop workers
        assert sized("hyperlight://?ray=many", 4) == 4  # never fewer than the calls at once
    finally:
        cluster.remove(many)
    assert sized("hyperlight://?ray=nowhere", 3) == 3  # unknown: num_workers, said why
    assert any("no node offers 'nowhere' yet" in r.getMessage() for r in caplog.records)


def test_serve_is_ready_when_a_node_offers_the_resource_and_runs_a_probe_there(
    cluster: RayCluster,
) -> None:
    import asyncio

    from verl_hyperlight.server import app as serve

    def readiness(url: str) -> tuple[bool, str]:
        settings = serve.Settings(url=url, cluster=True, max_concurrent=2)
        server = serve.create_app(settings).server

        async def until_decided() -> tuple[bool, str]:
            while True:
                ready, reason = await server.readiness()
                if reason != "warming up":
                    return ready, reason

        return asyncio.run(until_decided())

    a, b = cluster.nodes["a"], cluster.nodes["b"]
    before = a.case_runs() + b.case_runs()
    assert readiness("hyperlight://?ray") == (True, "ready")
    assert a.case_runs() + b.case_runs() == before + 1  # the probe case, on a node
    ready, reason = readiness("hyperlight://?ray=nobody")
    assert not ready and "no alive node of the Ray cluster offers the resource 'nobody'" in reason
    assert not cluster.head_log.exists()


def test_selftest_runs_its_programs_on_the_nodes_that_offer_the_resource(
    cluster: RayCluster,
) -> None:
    from verl_hyperlight.commands import selftest
    from verl_hyperlight.commands.conformance import PROGRAMS

    a, b = cluster.nodes["a"], cluster.nodes["b"]
    before = a.case_runs() + b.case_runs()
    report = selftest.selftest("hyperlight://?ray", 4, programs=PROGRAMS[:8])
    assert report.ok, selftest.render(report)
    names = [check.name for check in report.checks]
    assert names[0] == "nodes" and names.count("case") == 2
    # The notebook, then a case of each language besides Python (each compiled, or transpiled,
    # on the node that runs it).
    languages = ["cpp", "go", "rust", "java", "nodejs", "bash", "typescript"]
    assert names[-8:] == ["notebook", *(f"{language} case" for language in languages)]
    assert a.case_runs() + b.case_runs() >= before + 8
    assert not cluster.head_log.exists()


def test_warm_up_warms_each_node_that_offers_the_resource_once(
    cluster: RayCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    from verl_hyperlight.cli import main

    assert main(["warm-up", "hyperlight://?ray", "--memory-limit-mb", "512"]) == 0
    said = capsys.readouterr().out.splitlines()
    ids = {node["NodeID"][:8] for node in cluster.ray.nodes()}
    assert len(said) == 2 and all("the python image is warm on this node" in line for line in said)
    assert {line.split("]")[0].split()[-1] for line in said} <= ids
    assert not cluster.head_log.exists()
    assert main(["warm-up", "hyperlight://?ray=nobody"]) == 1


def test_a_memory_limit_is_judged_by_the_nodes_that_run_the_case(
    cluster: RayCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A GPU node with less memory than the KVM nodes sends them a limit it could not run."""
    from verl_hyperlight import node

    monkeypatch.setattr(node, "memory_mb", lambda: 1024)  # this process's node: 1 GiB
    response, error = run_code("hyperlight://", "print(1)", "", None, 10, 2048)
    assert response is None and error is not None and "more than half" in error
    answer, error = run_code("hyperlight://?ray", "print(3)", "", None, 10, 2048)
    assert error is None and answer is not None and result(answer)[3] == "3\n"


def test_the_kuberay_example_is_a_kvm_group_the_autoscaler_starts_from_zero() -> None:
    """examples/kuberay.yaml, read by Ray's own KubeRay autoscaler configuration."""
    pytest.importorskip("ray", reason="Ray is not installed: pip install -e '.[ray]'")
    import yaml
    from ray.autoscaler._private.kuberay.autoscaling_config import (
        _derive_autoscaling_config_from_ray_cr,
    )

    cr = yaml.safe_load((ROOT / "examples" / "kuberay.yaml").read_text())
    config = _derive_autoscaling_config_from_ray_cr(cr)
    kvm = config["available_node_types"]["kvm"]
    assert kvm["resources"]["hyperlight"] == 8 and kvm["min_workers"] == 0
    assert config["idle_timeout_minutes"] == 1
    head = config["available_node_types"]["headgroup"]
    assert "hyperlight" not in head["resources"] and head["resources"].get("CPU", 0) == 0
