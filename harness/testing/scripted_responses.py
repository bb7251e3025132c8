"""A scripted OpenAI Responses API on loopback, for driving Codex (`codex exec` with a model
provider whose `base_url` is `api.origin + "/v1"` and `wire_api = "responses"`) without a
model. Turns and recording: scripted_api.py.

Served: `POST /v1/responses`, streamed as the real API streams it: response.created,
response.in_progress, then per output item response.output_item.added, its deltas
(response.output_text.delta with content_part added/done and output_text.done; or
response.function_call_arguments.delta/.done), response.output_item.done, and last
response.completed with the whole response and its usage (or one `response` body when not
streamed); `GET /v1/models`. A tool result comes back as an input item of type
`function_call_output` naming the `function_call`'s `call_id` (`tool_results`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from .scripted_api import ScriptedApi, ToolCall, arguments_text, text_parts, words


class ScriptedResponses(ScriptedApi):
    protocol = "openai-responses"

    def route(self, method: str, path: str, body: dict[str, Any],
              headers: dict[str, str]) -> tuple[int, Any] | None:
        if method == "GET" and path.rstrip("/").endswith("/models"):
            return 200, {"object": "list", "data": [
                {"id": self.model, "object": "model", "created": 0, "owned_by": "forge"}]}
        return None

    def turn_path(self, path: str) -> bool:
        return path.rstrip("/").endswith("/responses")

    def offered(self, req: dict[str, Any]) -> list[tuple[str | None, str]]:
        names: list[tuple[str | None, str]] = []
        for t in req.get("tools") or []:
            if not isinstance(t, dict) or "name" not in t:
                continue
            if t.get("type") == "namespace":
                # A namespace of tools (how Codex offers one MCP server's tools, `mcp__forge`):
                # a call names the tool and its namespace.
                names.extend((t["name"], sub["name"]) for sub in t.get("tools") or []
                             if isinstance(sub, dict) and "name" in sub)
            else:
                names.append((None, t["name"]))
        return names

    def tool_results(self, req: dict[str, Any]) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for item in req.get("input") or []:
            if isinstance(item, dict) and item.get("type") == "function_call_output":
                out[str(item.get("call_id"))] = text_parts(item.get("output"))
        return out

    def error_body(self, message: str) -> dict[str, Any]:
        return {"error": {"type": "invalid_request_error", "message": message,
                          "code": "scripted"}}

    def _items(self, turn: dict[str, Any], calls: list[ToolCall], n: int
               ) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        if turn.get("text"):
            items.append({"id": f"msg_{n}", "type": "message", "status": "completed",
                          "role": "assistant", "content": [
                              {"type": "output_text", "text": turn["text"],
                               "annotations": []}]})
        for c in calls:
            item = {"id": f"fc_{c.call_id}", "type": "function_call", "status": "completed",
                    "call_id": c.call_id, "name": c.name, "arguments": arguments_text(c)}
            if c.namespace:
                item["namespace"] = c.namespace
            items.append(item)
        return items

    def whole(self, req: dict[str, Any], turn: dict[str, Any], calls: list[ToolCall],
              n: int) -> dict[str, Any]:
        tin, tout = words(req), words(turn)
        return {"id": f"resp_{n:04d}", "object": "response", "created_at": int(time.time()),
                "status": "completed", "model": req.get("model") or self.model,
                "output": self._items(turn, calls, n), "parallel_tool_calls": True,
                "usage": {"input_tokens": tin, "input_tokens_details": {"cached_tokens": 0},
                          "output_tokens": tout,
                          "output_tokens_details": {"reasoning_tokens": 0},
                          "total_tokens": tin + tout}}

    def stream(self, req: dict[str, Any], turn: dict[str, Any], calls: list[ToolCall],
               n: int) -> Iterator[tuple[str, dict[str, Any]]]:
        resp = self.whole(req, turn, calls, n)
        seq = iter(range(1_000_000))

        def ev(kind: str, **data: Any) -> tuple[str, dict[str, Any]]:
            return kind, {"type": kind, "sequence_number": next(seq), **data}

        pending = {**resp, "status": "in_progress", "output": [], "usage": None}
        yield ev("response.created", response=pending)
        yield ev("response.in_progress", response=pending)
        for i, item in enumerate(resp["output"]):
            if item["type"] == "message":
                text = item["content"][0]["text"]
                yield ev("response.output_item.added", output_index=i,
                         item={**item, "status": "in_progress", "content": []})
                part = {"type": "output_text", "text": "", "annotations": []}
                yield ev("response.content_part.added", item_id=item["id"], output_index=i,
                         content_index=0, part=part)
                yield ev("response.output_text.delta", item_id=item["id"], output_index=i,
                         content_index=0, delta=text)
                yield ev("response.output_text.done", item_id=item["id"], output_index=i,
                         content_index=0, text=text)
                yield ev("response.content_part.done", item_id=item["id"], output_index=i,
                         content_index=0, part={**part, "text": text})
            else:
                args = item["arguments"]
                yield ev("response.output_item.added", output_index=i,
                         item={**item, "status": "in_progress", "arguments": ""})
                half = len(args) // 2
                for delta in (args[:half], args[half:]):
                    yield ev("response.function_call_arguments.delta", item_id=item["id"],
                             output_index=i, delta=delta)
                yield ev("response.function_call_arguments.done", item_id=item["id"],
                         output_index=i, arguments=args)
            yield ev("response.output_item.done", output_index=i, item=item)
        yield ev("response.completed", response=resp)
