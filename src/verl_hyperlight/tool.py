"""verl's agent-loop code tool, each call run in a local micro-VM.

Named in a tool config (``actor_rollout_ref.rollout.multi_turn.tool_config_path``) as
``class_name: verl_hyperlight.tool.CodeInterpreterTool`` with ``config: {type: native,
sandbox_fusion_url: hyperlight://, ...}``, it takes the removed SandboxFusionTool's config
keys and answers as it did (see ``_tool``). The only module of the package that imports verl.
"""

from __future__ import annotations

import asyncio
from typing import Any
from uuid import uuid4

from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse
from verl.utils.reward_score.sandbox_fusion import utils as sandbox_utils
from verl.utils.rollout_trace import rollout_trace_op

from ._tool import DEFAULT_SCHEMA, CodeRunner, Response, ToolSettings


def _call_service(**arguments: Any) -> tuple[Response | None, str | None]:
    # Looked up per call, so that verl's function is used as it is now (wrapped or not).
    result: tuple[Response | None, str | None] = sandbox_utils.call_sandbox_api(**arguments)
    return result


class CodeInterpreterTool(BaseTool):  # type: ignore[misc]
    """Runs the `code` parameter (and optional `timeout`, `language`) of each call: by default
    stateless, every call in a fresh micro-VM (or on the Sandbox Fusion service an http(s) URL
    names); with `session: trajectory`, a trajectory's calls in one notebook.

    A notebook is keyed by the trajectory's request id when the agent loop passes its
    `agent_data` (verl 0.9's tool agent loop, which creates and releases an instance around
    each call), else by the instance: `release` ends a notebook keyed by its instance, and
    `session_idle_timeout` ends every notebook once its trajectory stops calling."""

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
        trajectory = getattr(agent_data, "request_id", None)
        session = str(trajectory) if trajectory is not None else instance_id
        text, metrics = await self.runner.call(parameters, session)
        return ToolResponse(text=text), 0.0, metrics

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        return 0.0

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        """End the notebook keyed by this instance, if any (stateless calls hold nothing)."""
        await asyncio.to_thread(self.runner.release, instance_id)
