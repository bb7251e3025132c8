"""The chat stream chunks a released SGLang writes, from its own chunk builder (run under the
kit, 0.5.23: `sglang/srt/entrypoints/openai/sse_utils.build_sse_content`, as serving_chat.py
calls it): the role chunk, one content chunk per word of ARGS, the `finish_reason` chunk.
Prints them as a JSON list. Usage: render_chat_stream.py ID CREATED MODEL FINISH WORD ..."""

import json
import sys

from sglang.srt.entrypoints.openai.sse_utils import build_sse_content

rid, created, model, finish, *words = sys.argv[1:]
common = {"chunk_id": rid, "created": int(created), "model": model, "index": 0}
sse = [build_sse_content(**common, role="assistant", content="")]
sse += [build_sse_content(**common, content=" " + w) for w in words]
sse.append(build_sse_content(**common, finish_reason=finish))
print(json.dumps([json.loads(s.strip().removeprefix("data: ")) for s in sse]))
