"""What a scripted server received, summarized per request so tests can check what was sent.

`summarize(path, body)` → `{"path", "endpoint", "text", "max_tokens", "images": [{"width",
"height", "format", "bytes"}], "image_errors": [...]}`: `text` is the prompt (completions) or
the user-visible text of the messages (string contents and `text` parts, joined by "\\n");
each `image_url` part with a base64 data URL is decoded and its PNG/JPEG header read for its
size (no imaging library needed). Tokenizing `text` is the test's business: the server has no
tokenizer.
"""

from __future__ import annotations

import base64
import struct
from typing import Any


def message_text(body: dict) -> str:
    """The request's text: `prompt`, or the messages' string contents and text parts."""
    if "messages" not in body:
        p = body.get("prompt", "")
        return p if isinstance(p, str) else str(p)
    out = []
    for m in body.get("messages") or []:
        if not isinstance(m, dict):
            continue
        c = m.get("content", "")
        if isinstance(c, str):
            out.append(c)
        elif isinstance(c, list):
            out.extend(str(part.get("text", "")) for part in c
                       if isinstance(part, dict) and part.get("type") == "text")
    return "\n".join(out)


def image_urls(body: dict) -> list[str]:
    urls = []
    for m in body.get("messages") or []:
        c = m.get("content") if isinstance(m, dict) else None
        for part in c if isinstance(c, list) else []:
            if isinstance(part, dict) and part.get("type") == "image_url":
                iu = part.get("image_url")
                urls.append(str(iu.get("url", "")) if isinstance(iu, dict) else str(iu))
    return urls


def image_size(data: bytes) -> tuple[str, int, int]:
    """(format, width, height) from a PNG or JPEG header; ValueError otherwise."""
    if data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR":
        w, h = struct.unpack(">II", data[16:24])
        return "png", w, h
    if data[:2] == b"\xff\xd8":
        i = 2
        while i + 9 < len(data):
            if data[i] != 0xFF:
                raise ValueError("bad JPEG marker")
            marker, seg = data[i + 1], struct.unpack(">H", data[i + 2:i + 4])[0]
            if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
                h, w = struct.unpack(">HH", data[i + 5:i + 9])
                return "jpeg", w, h
            i += 2 + seg
        raise ValueError("JPEG without a frame header")
    raise ValueError("neither PNG nor JPEG")


def summarize(path: str, body: dict) -> dict[str, Any]:
    images: list[dict[str, Any]] = []
    errors: list[str] = []
    for url in image_urls(body):
        head, _, payload = url.partition(",")
        if not (head.startswith("data:") and head.endswith(";base64")):
            errors.append(f"not a base64 data URL: {url[:40]!r}")
            continue
        try:
            data = base64.b64decode(payload, validate=True)
            fmt, w, h = image_size(data)
        except ValueError as e:
            errors.append(str(e))
            continue
        images.append({"width": w, "height": h, "format": fmt, "bytes": len(data),
                       "mime": head[5:-7]})
    return {"path": path, "endpoint": "chat" if "messages" in body else "completions",
            "text": message_text(body),
            "max_tokens": body.get("max_tokens") or body.get("max_completion_tokens"),
            "images": images, "image_errors": errors}
