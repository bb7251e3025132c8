"""A scripted Anthropic Messages API on loopback, for driving Claude Code (`claude -p` with
`ANTHROPIC_BASE_URL` = `api.origin`) without a model. Turns and recording: scripted_api.py.

Served: `POST /v1/messages` (streamed as the real API streams it: message_start, then per
content block content_block_start / content_block_delta (text_delta, input_json_delta) /
content_block_stop, then message_delta with the stop_reason (`tool_use` or `end_turn`) and
usage, message_stop; or one `message` body when not streamed), `POST
/v1/messages/count_tokens`, `GET /v1/models`. A tool result comes back as a user message's
`tool_result` block naming the `tool_use` id (`tool_results`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from .scripted_api import ScriptedApi, ToolCall, arguments_text, text_parts, words


class ScriptedMessages(ScriptedApi):
    protocol = "anthropic-messages"
    id_prefix = "toolu_"

    def route(self, method: str, path: str, body: dict[str, Any],
              headers: dict[str, str]) -> tuple[int, Any] | None:
        p = path.rstrip("/")
        if method == "POST" and p.endswith("/messages/count_tokens"):
            return 200, {"input_tokens": words(body)}
        if method == "GET" and p.endswith("/models"):
            return 200, {"data": [{"type": "model", "id": self.model,
                                   "display_name": self.model,
                                   "created_at": "2026-01-01T00:00:00Z"}],
                         "has_more": False, "first_id": self.model, "last_id": self.model}
        return None

    def turn_path(self, path: str) -> bool:
        return path.rstrip("/").endswith("/messages")

    def offered(self, req: dict[str, Any]) -> list[tuple[str | None, str]]:
        return [(None, t["name"]) for t in req.get("tools") or []
                if isinstance(t, dict) and "name" in t]

    def tool_results(self, req: dict[str, Any]) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for m in req.get("messages") or []:
            if m.get("role") != "user" or not isinstance(m.get("content"), list):
                continue
            for b in m["content"]:
                if isinstance(b, dict) and b.get("type") == "tool_result":
                    out[str(b.get("tool_use_id"))] = text_parts(b.get("content"))
        return out

    def _blocks(self, turn: dict[str, Any], calls: list[ToolCall]) -> list[dict[str, Any]]:
        blocks: list[dict[str, Any]] = []
        if turn.get("text"):
            blocks.append({"type": "text", "text": turn["text"]})
        for c in calls:
            blocks.append({"type": "tool_use", "id": c.call_id, "name": c.name,
                           "input": c.arguments})
        return blocks

    def _stop(self, calls: list[ToolCall]) -> str:
        return "tool_use" if calls else "end_turn"

    def whole(self, req: dict[str, Any], turn: dict[str, Any], calls: list[ToolCall],
              n: int) -> dict[str, Any]:
        return {"id": f"msg_{n:04d}", "type": "message", "role": "assistant",
                "model": req.get("model") or self.model,
                "content": self._blocks(turn, calls), "stop_reason": self._stop(calls),
                "stop_sequence": None,
                "usage": {"input_tokens": words(req), "output_tokens": words(turn)}}

    def stream(self, req: dict[str, Any], turn: dict[str, Any], calls: list[ToolCall],
               n: int) -> Iterator[tuple[str, dict[str, Any]]]:
        msg = self.whole(req, turn, calls, n)
        yield "message_start", {"type": "message_start", "message": {
            **msg, "content": [], "stop_reason": None,
            "usage": {"input_tokens": msg["usage"]["input_tokens"], "output_tokens": 1}}}
        for i, block in enumerate(msg["content"]):
            if block["type"] == "text":
                yield "content_block_start", {"type": "content_block_start", "index": i,
                                              "content_block": {"type": "text", "text": ""}}
                yield "content_block_delta", {"type": "content_block_delta", "index": i,
                                              "delta": {"type": "text_delta",
                                                        "text": block["text"]}}
            else:
                yield "content_block_start", {"type": "content_block_start", "index": i,
                                              "content_block": {**block, "input": {}}}
                text = arguments_text(calls[i - (len(msg["content"]) - len(calls))])
                # Two deltas: the client must join partial JSON, as with a real model.
                half = len(text) // 2
                for part in (text[:half], text[half:]):
                    yield "content_block_delta", {"type": "content_block_delta", "index": i,
                                                  "delta": {"type": "input_json_delta",
                                                            "partial_json": part}}
            yield "content_block_stop", {"type": "content_block_stop", "index": i}
        yield "message_delta", {"type": "message_delta",
                                "delta": {"stop_reason": msg["stop_reason"],
                                          "stop_sequence": None},
                                "usage": {"output_tokens": msg["usage"]["output_tokens"]}}
        yield "message_stop", {"type": "message_stop"}
