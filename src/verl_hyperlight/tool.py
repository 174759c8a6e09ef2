"""verl's agent-loop code tool, each call run in a local micro-VM.

Named in a tool config (``actor_rollout_ref.rollout.multi_turn.tool_config_path``) as
``class_name: verl_hyperlight.tool.CodeInterpreterTool`` with ``config: {type: native,
sandbox_fusion_url: hyperlight://, ...}``, it takes the removed SandboxFusionTool's config
keys and answers as it did (see ``agent.calls``). The only module of the package that imports verl.
"""

from __future__ import annotations

import asyncio
from typing import Any
from uuid import uuid4

from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse
from verl.utils.reward_score.sandbox_fusion import utils as sandbox_utils
from verl.utils.rollout_trace import rollout_trace_op

from .agent.calls import DEFAULT_SCHEMA, CodeRunner, Response, ToolSettings


def _call_service(**arguments: Any) -> tuple[Response | None, str | None]:
    # Looked up per call, so that verl's function is used as it is at the call (wrapped or not).
    result: tuple[Response | None, str | None] = sandbox_utils.call_sandbox_api(**arguments)
    return result


class CodeInterpreterTool(BaseTool):  # type: ignore[misc]
    """Runs the `code` parameter (and optional `timeout`, `language`) of each call: by default
    stateless, every call in a fresh micro-VM (or on the Sandbox Fusion service an http(s) URL
    names); with `session: trajectory`, a trajectory's calls in one notebook.

    verl 0.9's tool agent loop creates and releases an instance around each call and passes
    the trajectory's `agent_data` to `execute`; it tells a tool nothing when the trajectory
    is done, but its `agent_data` lives exactly as long as the trajectory's `run`. So a
    notebook is kept by that `agent_data` and ended when it is collected (by its request id,
    ended by `session_idle_timeout`, when it cannot be weakly referenced); without
    `agent_data`, by the instance, ended by `release`."""

    def __init__(self, config: dict[str, Any], tool_schema: OpenAIFunctionToolSchema | None):
        self.runner = CodeRunner(ToolSettings.from_config(config), _call_service)
        super().__init__(config, tool_schema)

    def get_openai_tool_schema(self) -> OpenAIFunctionToolSchema:
        # BaseTool asks for it before tool_schema is set, when the config gives none.
        schema = getattr(self, "tool_schema", None)
        return schema or OpenAIFunctionToolSchema.model_validate(DEFAULT_SCHEMA)

    async def create(
        self, instance_id: str | None = None, **kwargs: Any
    ) -> tuple[str, ToolResponse]:
        return instance_id or str(uuid4()), ToolResponse()

    @rollout_trace_op  # type: ignore[untyped-decorator]
    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[ToolResponse, float, dict[str, Any]]:
        agent_data = kwargs.get("agent_data")
        request_id = getattr(agent_data, "request_id", None)
        if request_id is None:
            text, metrics = await self.runner.call(parameters, instance_id)
        else:
            text, metrics = await self.runner.call(parameters, str(request_id), agent_data)
        return ToolResponse(text=text), 0.0, metrics

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        return 0.0

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        """End the notebook keyed by this instance, if any (stateless calls hold nothing)."""
        await asyncio.to_thread(self.runner.release, instance_id)
