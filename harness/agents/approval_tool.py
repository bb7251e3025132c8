"""The agent tool of the human gate: `request_approval` (`TOOLS`, for a registry's user to
assemble: harness/mcp/loop_tools.py, harness/loop/agent_executor.py).

An agent may ASK for a person's approval of an action (a push, a production call, a cleanup,
an acceptance); the request is recorded with the agent as its actor and `forge approvals`
shows it. There is deliberately no tool that grants or denies: `approvals.decide` refuses
any actor that is not a human, and records the attempt.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from ..guard import approvals
from .tool_registry import AgentTool, Args, ToolContext


class RequestApprovalArgs(Args):
    kind: Literal["push", "production-call", "cleanup", "accept"] = Field(
        description="what needs a person: push (to a protected ref), production-call (a "
        "mutating call to a production endpoint), cleanup (killing processes), accept")
    target: str = Field(min_length=1, max_length=500, description=(
        "what it acts on: member:remote:ref, an endpoint URL, a process group, task:block"))
    arguments: dict[str, Any] = Field(default_factory=dict, description=(
        "the exact action (a commit range old..new, a method and path, a candidate): the "
        "approval lets through this action and no other"))
    summary: str = Field(min_length=1, max_length=2000, description="why, for the person")


def _request_approval(ctx: ToolContext, a: RequestApprovalArgs) -> Any:
    aid = approvals.request(ctx.ws, a.kind, a.target, a.arguments, a.summary, ctx.actor)
    gate = approvals.check(ctx.ws, a.kind, a.target, a.arguments)
    return {"approval_id": aid, "state": gate.state,
            "next": "a person decides: " + approvals.waiting_line(aid)}


TOOLS = [AgentTool(
    "request_approval", "Ask a person to approve an action that needs one (a push to a "
    "protected ref, a mutating production call, a cleanup, an acceptance). Returns the "
    "approval id; a person decides it with forge approve/deny. Agents cannot grant "
    "approvals.", RequestApprovalArgs, _request_approval, writes=True)]
