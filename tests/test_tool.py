"""The agent-loop code tool as verl loads it: a tool config naming
verl_hyperlight.tool.CodeInterpreterTool, built by verl's own initialize_tools_from_config and
driven as verl's agent loop drives a tool (create, execute, release), against the stand-in."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import re
import string
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip(
    "verl", reason="verl is not installed: pip install torch==2.13.0 verl==0.9.1 to run these"
)

import yaml
from hostside import Host, fail_with, notebooks, processes_with, still_running, wait_for
from verl.tools.tool_registry import initialize_tools_from_config

from verl_hyperlight.agent.calls import NO_STDOUT, NOT_RUN, NOTEBOOK_RESTARTED

CLASS = "verl_hyperlight.tool.CodeInterpreterTool"
EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "code_tool.yaml"


def load(tmp_path: Path, schema: dict[str, Any] | None = None, **config: Any) -> Any:
    """The tool verl builds from a config file naming our class."""
    entry: dict[str, Any] = {
        "class_name": CLASS,
        "config": {"type": "native", "sandbox_fusion_url": "hyperlight://", **config},
    }
    if schema is not None:
        entry["tool_schema"] = schema
    path = tmp_path / "tools.yaml"
    path.write_text(yaml.safe_dump({"tools": [entry]}))
    (tool,) = initialize_tools_from_config(str(path))
    return tool


async def call(tool: Any, parameters: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """One call as verl's agent loop makes it: create, execute, release."""
    instance_id, _ = await tool.create(create_kwargs={})
    try:
        response, reward, metrics = await tool.execute(instance_id, parameters, agent_data=None)
    finally:
        await tool.release(instance_id)
    assert reward == 0.0
    return response.text, metrics


def run(tool: Any, code: str, **parameters: Any) -> tuple[str, dict[str, Any]]:
    return asyncio.run(call(tool, {"code": code, **parameters}))


def test_verl_builds_the_tool_with_the_code_interpreter_schema(tmp_path: Path) -> None:
    tool = load(tmp_path)
    schema = tool.get_openai_tool_schema().model_dump()
    assert tool.name == "code_interpreter"
    assert schema["function"]["parameters"]["required"] == ["code"]
    assert schema["function"]["parameters"]["properties"]["code"]["type"] == "string"


def test_a_schema_in_the_config_is_the_one_offered(tmp_path: Path) -> None:
    schema = {
        "type": "function",
        "function": {
            "name": "python",
            "description": "Run Python.",
            "parameters": {
                "type": "object",
                "properties": {"code": {"type": "string", "description": "source"}},
                "required": ["code"],
            },
        },
    }
    assert load(tmp_path, schema).name == "python"


def test_the_example_config_loads(hluk: Path) -> None:
    (tool,) = initialize_tools_from_config(str(EXAMPLE))
    assert tool.runner.settings.in_micro_vms


def test_right_code_answers_its_output(host: Host, tmp_path: Path) -> None:
    text, metrics = run(load(tmp_path), "print(sum(range(10)))")
    assert text == "45\n"
    assert metrics["status"] == "Success" and metrics["run_status"] == "Finished"
    assert isinstance(metrics["execution_time"], float)
    assert host.case_dirs() == []


def test_an_exception_answers_its_traceback_as_the_removed_tool_did(
    host: Host, tmp_path: Path
) -> None:
    text, metrics = run(load(tmp_path), "print('before')\nraise ValueError('boom')")
    assert text.startswith("before\nTraceback (most recent call last):")
    assert text.endswith("ValueError: boom\n")
    assert metrics["status"] == "Failed" and metrics["return_code"] == 1


def test_a_call_past_its_timeout_answers_no_stdout(host: Host, tmp_path: Path) -> None:
    text, metrics = run(load(tmp_path), "import time\ntime.sleep(30)", timeout=1)
    assert text == NO_STDOUT
    assert metrics["run_status"] == "TimeLimitExceeded"


def test_detailed_errors_tell_the_model_what_happened(host: Host, tmp_path: Path) -> None:
    tool = load(tmp_path, detailed_errors=True)
    text, _ = run(tool, "import time\ntime.sleep(30)", timeout=1)
    assert text == "Time limit exceeded: the code ran past 1 s and was stopped."
    text, _ = run(tool, "print('x')\nimport sys\nsys.exit(3)")
    assert text == "x\nExited with return code 3."
    text, _ = run(tool, "1 / 0")
    assert text.startswith("Exited with return code 1. The end of stderr:\nTraceback")
    assert text.endswith("ZeroDivisionError: division by zero\n")


def test_large_output_comes_back_whole(host: Host, tmp_path: Path) -> None:
    text, _ = run(load(tmp_path), "import sys\nsys.stdout.write('ab' * 1_000_000)")
    assert text == "ab" * 1_000_000


def test_non_ascii_text_passes_both_ways(host: Host, tmp_path: Path) -> None:
    text, _ = run(load(tmp_path), "s = 'héllo → 世界 🎉'\nprint(s[::-1], len(s))")
    assert text == "🎉 界世 → olléh 12\n"


def test_print_last_expression_shows_a_final_value(host: Host, tmp_path: Path) -> None:
    tool = load(tmp_path, print_last_expression=True)
    assert run(tool, "import math\nx = 3\nmath.factorial(x) * 7")[0] == "42\n"
    assert run(tool, "x = 3")[0] == ""
    plain = load(tmp_path)
    assert run(plain, "import math\nmath.factorial(3) * 7")[0] == ""


def test_the_language_and_timeout_parameters_are_read(host: Host, tmp_path: Path) -> None:
    tool = load(tmp_path, detailed_errors=True)
    assert run(tool, "puts 1", language="ruby")[0] == NOT_RUN
    program = '#include <cstdio>\nint main() { std::printf("%d\\n", 6 * 7); }\n'
    assert run(tool, program, language="cpp")[0] == "42\n"
    assert run(tool, "print(1)", timeout="5")[0] == "1\n"


def test_concurrent_calls_on_one_instance_and_across_instances_get_their_own_answers(
    host: Host, tmp_path: Path
) -> None:
    tool = load(tmp_path, num_workers=4)

    async def main() -> list[str]:
        instance_id, _ = await tool.create(create_kwargs={})

        async def on_the_instance(code: str) -> str:
            response, _, _ = await tool.execute(instance_id, {"code": code}, agent_data=None)
            return str(response.text)

        async def on_its_own(code: str) -> str:
            return (await call(tool, {"code": code}))[0]

        texts = await asyncio.gather(
            *(on_the_instance(f"print({n} * {n})") for n in range(8)),
            *(on_its_own(f"print({n} + 1000)") for n in range(8)),
        )
        await tool.release(instance_id)
        return list(texts)

    texts = asyncio.run(main())
    assert texts == [f"{n * n}\n" for n in range(8)] + [f"{n + 1000}\n" for n in range(8)]
    assert host.case_dirs() == []


@pytest.mark.parametrize("session", ["none", "trajectory"])
def test_a_backend_failure_answers_a_neutral_text_and_is_logged_once(
    host: Host,
    fail_file: Path,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    session: str,
) -> None:
    """Stateless, or in a notebook that cannot start (each call's own: no agent_data)."""
    fail_with(monkeypatch, fail_file, "failed to open /dev/kvm: Permission denied", 1000)
    tool = load(tmp_path, detailed_errors=True, session=session)

    def errors() -> int:
        return sum(1 for r in caplog.records if r.levelname == "ERROR")

    for _ in range(3):
        text, metrics = run(tool, "print(1)")
        assert text == NOT_RUN and metrics["status"] == "SandboxError"
    assert "Traceback" not in text
    # The failure and the guest's gate opening, as run_code logs them; no more per call.
    assert "kvm" in caplog.text and errors() <= 2
    logged = errors()
    for _ in range(5):
        assert run(tool, "print(1)")[0] == NOT_RUN
    assert errors() == logged
    assert not notebooks()
    plain = load(tmp_path, session=session)
    assert run(plain, "print(1)")[0] == NO_STDOUT


def test_an_http_url_sends_the_calls_to_that_service(
    serve: Callable[..., Any], tmp_path: Path
) -> None:
    served = serve()
    tool = load(tmp_path, sandbox_fusion_url=served.run_code_url)
    text, metrics = run(tool, "print('over http')")
    assert text == "over http\n" and metrics["status"] == "Success"
    assert '"POST /run_code"' in served.logged()


def test_nothing_is_left_behind_in_a_process_that_used_the_tool(hluk: Path, tmp_path: Path) -> None:
    """A fresh process loads the tool through verl, makes calls and exits: no hluk process or
    case directory remains."""
    script = f"""
import asyncio, json, sys, yaml
from verl.tools.tool_registry import initialize_tools_from_config
path = {str(tmp_path / "tools.yaml")!r}
yaml.safe_dump({{"tools": [{{"class_name": {CLASS!r},
    "config": {{"type": "native", "sandbox_fusion_url": "hyperlight://"}}}}]}}, open(path, "w"))
(tool,) = initialize_tools_from_config(path)
async def main():
    texts = []
    for n in range(3):
        i, _ = await tool.create(create_kwargs={{}})
        response, _, _ = await tool.execute(i, {{"code": f"print({{n}})"}})
        await tool.release(i)
        texts.append(response.text)
    return texts
print(json.dumps(asyncio.run(main())))
"""
    cases = tmp_path / "cases"
    cases.mkdir()
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TMPDIR": str(cases), "VERL_HYPERLIGHT_CASE_DIR": str(cases)},
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == ["0\n", "1\n", "2\n"]
    assert list(cases.glob("verl-hyperlight-*")) == []
    assert processes_with(str(cases)) == []  # hluk's argv names its case directory


# ---------------------------------------------------------------------------------------------
# session: trajectory, driven as verl 0.9's tool agent loop drives it: create, execute with the
# trajectory's agent_data, release, around every call.


def in_trajectory(tool: Any, trajectory: str, code: str, **parameters: Any) -> str:
    async def one() -> str:
        instance_id, _ = await tool.create(create_kwargs={})
        try:
            agent_data = SimpleNamespace(request_id=trajectory)
            response, _, _ = await tool.execute(
                instance_id, {"code": code, **parameters}, agent_data=agent_data
            )
        finally:
            await tool.release(instance_id)
        return str(response.text)

    return asyncio.run(one())


def test_a_trajectorys_calls_share_a_notebook_that_another_trajectory_cannot_see(
    host: Host, tmp_path: Path
) -> None:
    tool = load(tmp_path, session="trajectory")
    try:
        assert in_trajectory(tool, "t1", "import math\nr = math.sqrt(16)\nprint(r)") == "4.0\n"
        assert in_trajectory(tool, "t1", "print(r + 1, math.pi > 3)") == "5.0 True\n"
        assert "NameError" in in_trajectory(tool, "t2", "print(r)")
        assert in_trajectory(tool, "t1", "print('é → ✓', r)") == "é → ✓ 4.0\n"
        held = notebooks()
        assert len(held) == 2
    finally:
        tool.runner.close()
    assert wait_for(lambda: not still_running(held))


def test_release_ends_a_notebook_kept_by_its_instance(host: Host, tmp_path: Path) -> None:
    """An agent loop that creates one instance per trajectory (no agent_data): its calls share
    the instance's notebook, and release ends it."""
    tool = load(tmp_path, session="trajectory")

    async def trajectory() -> list[str]:
        instance_id, _ = await tool.create(create_kwargs={})
        texts = []
        for code in ("x = [1, 2]", "x.append(3)\nprint(x)"):
            response, _, _ = await tool.execute(instance_id, {"code": code})
            texts.append(str(response.text))
        held.update(notebooks())
        assert len(held) == 1
        await tool.release(instance_id)
        return texts

    held: dict[int, bytes] = {}
    try:
        assert asyncio.run(trajectory()) == ["", "[1, 2, 3]\n"]
        assert wait_for(lambda: not still_running(held))
    finally:
        tool.runner.close()


def test_notebooks_idle_past_their_timeout_end_and_at_the_cap_the_least_recent_makes_room(
    host: Host, tmp_path: Path
) -> None:
    """agent_data that cannot be weakly referenced (a SimpleNamespace) gives no end: such
    notebooks are kept by request id and ended by the cap and the idle timeout, and the
    trajectory is told its state is gone."""
    tool = load(tmp_path, session="trajectory", max_sessions=1, session_idle_timeout=3)
    try:
        assert in_trajectory(tool, "t1", "y = 1\nprint(y)") == "1\n"
        held = notebooks()
        assert in_trajectory(tool, "t2", "print(2)") == "2\n"  # t1's notebook made room
        assert wait_for(lambda: not still_running(held), 15)
        assert wait_for(lambda: not notebooks(), 15)  # t2's, idle past 3 s: ended
        text = in_trajectory(tool, "t1", "print(y)")
        assert "NameError" in text and text.endswith(f"\n{NOTEBOOK_RESTARTED}")
    finally:
        tool.runner.close()


def test_a_timed_out_call_ends_its_notebook_and_says_so(host: Host, tmp_path: Path) -> None:
    tool = load(tmp_path, session="trajectory")
    try:
        in_trajectory(tool, "t1", "z = 5")
        text = in_trajectory(tool, "t1", "import time\ntime.sleep(60)", timeout=1)
        assert text == f"{NO_STDOUT}\n{NOTEBOOK_RESTARTED}"
        assert "NameError" in in_trajectory(tool, "t1", "print(z)")
    finally:
        tool.runner.close()


def test_a_worker_killed_while_holding_notebooks_takes_their_micro_vms(
    hluk: Path, tmp_path: Path
) -> None:
    """A process holding two trajectories' notebooks is SIGKILLed: their hluk die with it."""
    script = f"""
import asyncio, sys, time, types, yaml
from verl.tools.tool_registry import initialize_tools_from_config
path = {str(tmp_path / "tools.yaml")!r}
yaml.safe_dump({{"tools": [{{"class_name": {CLASS!r}, "config": {{"type": "native",
    "sandbox_fusion_url": "hyperlight://", "session": "trajectory"}}}}]}}, open(path, "w"))
(tool,) = initialize_tools_from_config(path)
async def main():
    for trajectory in ("t1", "t2"):
        i, _ = await tool.create(create_kwargs={{}})
        data = types.SimpleNamespace(request_id=trajectory)
        response, _, _ = await tool.execute(i, {{"code": "v = 1"}}, agent_data=data)
        await tool.release(i)
asyncio.run(main())
print("holding", flush=True)
time.sleep(600)
"""
    worker = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        assert worker.stdout is not None
        for line in worker.stdout:  # verl prints its tool config first
            if line == b"holding\n":
                break
        assert line == b"holding\n"
        held = notebooks(worker.pid)
        assert len(held) == 2
    finally:
        worker.kill()
        worker.wait()
    # Orphans would no longer be the worker's descendants: the pids held are what is checked.
    assert wait_for(lambda: not still_running(held))


# ---------------------------------------------------------------------------------------------
# Through verl 0.9's own ToolAgentLoop, with a scripted model in place of the inference server
# and a tokenizer of single characters made here: its run, its tool calls, and the end of its
# trajectory, which it tells a tool nothing of but by dropping its agent_data.


def character_tokenizer() -> Any:
    """A Hugging Face tokenizer of one token per printable character, with a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<unk>", "<|im_start|>", "<|im_end|>"]
    vocab = {token: n for n, token in enumerate(specials + sorted(set(string.printable)))}
    model = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    model.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    model.decoder = decoders.Fuse()
    template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=model,
        pad_token="<pad>",
        unk_token="<unk>",
        eos_token="<|im_end|>",
        chat_template=template,
    )
    tokenizer.add_special_tokens({"additional_special_tokens": specials[2:]})
    return tokenizer


class ScriptedModel:
    """verl's server manager for one trajectory: each turn calls the code interpreter with the
    next of `codes`, then a last turn calls nothing; it keeps the prompts it was given (where
    the tool's answers are) and the notebooks up at its last turn."""

    def __init__(self, tokenizer: Any, codes: list[str]) -> None:
        self.tokenizer = tokenizer
        self.codes = codes
        self.prompts: list[str] = []
        self.held: dict[int, bytes] = {}

    async def generate(self, request_id: str, prompt_ids: list[int], **kwargs: Any) -> Any:
        from verl.workers.rollout.replica import TokenOutput

        self.prompts.append(self.tokenizer.decode(prompt_ids))
        turn = len(self.prompts) - 1
        if turn < len(self.codes):
            arguments = {"name": "code_interpreter", "arguments": {"code": self.codes[turn]}}
            text = f"<tool_call>{json.dumps(arguments)}</tool_call>"
        else:
            self.held.update(notebooks())
            text = "done"
        ids = self.tokenizer.encode(text + "<|im_end|>", add_special_tokens=False)
        return TokenOutput(token_ids=ids)

    def answers(self) -> list[str]:
        """What the tool answered, as the model read it."""
        return re.findall(r"<\|im_start\|>tool\n(.*?)<\|im_end\|>", self.prompts[-1], re.DOTALL)


def tool_agent_loop(tool: Any, model: ScriptedModel, full_determinism: bool = False) -> Any:
    """verl's ToolAgentLoop for one trajectory, as its agent-loop worker builds one (within the
    running event loop, which it keeps)."""
    agent_loop = pytest.importorskip("verl.experimental.agent_loop.agent_loop")
    tool_agent = pytest.importorskip("verl.experimental.agent_loop.tool_agent_loop")
    from omegaconf import OmegaConf

    rollout = {
        "multi_turn": {
            "max_user_turns": 8,
            "max_assistant_turns": 8,
            "max_parallel_calls": 1,
            "max_tool_response_length": 10_000,
            "tool_response_truncate_side": "right",
            "format": "hermes",
        },
        "prompt_length": 8192,
        "response_length": 8192,
        "full_determinism": full_determinism,
    }
    config = OmegaConf.create({"actor_rollout_ref": {"rollout": rollout}, "data": {}})
    return tool_agent.ToolAgentLoop(
        trainer_config=agent_loop.DictConfigWrap(config),
        server_manager=model,
        tokenizer=model.tokenizer,
        processor=None,
        dataset_cls=None,
        data_config=agent_loop.DictConfigWrap(config.data),
        tools=agent_loop.ToolListWrap([tool]),
    )


async def trajectory(tool: Any, model: ScriptedModel, full_determinism: bool = False) -> None:
    """One trajectory run by verl's loop; priority 0 for each, as equal det-N ids come."""
    loop = tool_agent_loop(tool, model, full_determinism)
    await loop.run({}, priority=0, raw_prompt=[{"role": "user", "content": "compute"}])


@pytest.mark.parametrize("full_determinism", [False, True])
def test_verls_tool_agent_loop_keeps_a_notebook_per_trajectory_ended_when_its_run_returns(
    host: Host, tmp_path: Path, full_determinism: bool
) -> None:
    """Two trajectories at once (with full_determinism both named det-0): each reads back its
    own state, and once verl's run returns, its notebook is ended, not left for the idle
    timeout."""
    tool = load(tmp_path, session="trajectory")
    tokenizer = character_tokenizer()
    first = ScriptedModel(tokenizer, ["x = 41", "print(x + 1)"])
    second = ScriptedModel(tokenizer, ["x = 'mine'", "print(x)"])

    async def both() -> None:
        await asyncio.gather(
            trajectory(tool, first, full_determinism), trajectory(tool, second, full_determinism)
        )

    try:
        asyncio.run(both())
        assert (first.answers(), second.answers()) == (["", "42\n"], ["", "mine\n"])
        held = {**first.held, **second.held}
        assert len(held) == 2
        assert wait_for(lambda: not still_running(held))
        assert not tool.runner.notebooks.by_key
    finally:
        tool.runner.close()


def test_a_cancelled_trajectorys_notebook_ends_once_verl_drops_its_task(
    host: Host, tmp_path: Path
) -> None:
    """A run cancelled during its call (an aborted rollout): its agent_data lives on in the
    cancelled task's exception until the task is dropped, then its notebook ends."""
    tool = load(tmp_path, session="trajectory")
    model = ScriptedModel(character_tokenizer(), ["x = 1", "import time\ntime.sleep(60)"])

    pool = tool.runner.notebooks

    async def cancelled() -> dict[int, bytes]:
        task = asyncio.ensure_future(trajectory(tool, model))
        while len(model.prompts) < 2 or not notebooks():  # its second call is running
            await asyncio.sleep(0.05)
        held = notebooks()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        gc.collect()
        assert pool.keys  # the task's exception holds run's frame, and so its agent_data
        del task
        return held

    try:
        held = asyncio.run(cancelled())
        assert wait_for(lambda: not still_running(held))  # the cancel killed its micro-VM
        gc.collect()  # the exception's traceback and the frames it holds form cycles
        assert wait_for(lambda: not pool.keys and not pool.left and not pool.by_key)
    finally:
        tool.runner.close()


def test_with_rollout_tracing_on_a_notebook_still_ends_when_its_run_returns(
    host: Host, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """verl's rollout tracing binds every traced call's inputs, the tool's execute's
    agent_data among them; its trackio backend (a client double that keeps every trace it is
    given) serializes them, so the trajectory's end is still seen."""
    from verl.utils.rollout_trace import RolloutTraceConfig

    traces: list[Any] = []
    client = SimpleNamespace(Trace=SimpleNamespace, log=lambda data, step=None: traces.append(data))
    config = RolloutTraceConfig.get_instance()
    monkeypatch.setattr(config, "backend", "trackio")
    monkeypatch.setattr(config, "client", client)
    tool = load(tmp_path, session="trajectory")
    model = ScriptedModel(character_tokenizer(), ["x = 41", "print(x + 1)"])
    try:
        asyncio.run(trajectory(tool, model))
        assert model.answers() == ["", "42\n"]
        assert any("CodeInterpreterTool.execute" in key for data in traces for key in data)
        assert len(model.held) == 1
        assert wait_for(lambda: not still_running(model.held))
        assert not tool.runner.notebooks.by_key
    finally:
        tool.runner.close()
