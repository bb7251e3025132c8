"""Run under the kit (harness/engines/sglang_import.py) with SGLang 0.5.23: the `/server_info`
answer that release's own code builds (its route in entrypoints/http_server.py:
`build_server_info(server_args, scheduler_info)` plus startup_time, internal_states, version
and frontend), for the server argv in argv[2:], with the scheduler's handshake info and the
per-DP internal states taken from argv[1] (a JSON file: {"scheduler_info": {...},
"internal_states": [...]}); and the release's `--help`. Printed as JSON {"server_info": ...,
"help": ...}: how the stand-in's server_info.json and help.txt are made
(tests/harness/engines/test_stand_in_server_info.py)."""

import argparse
import json
import sys

import sglang.srt.server_args as sa
from sglang.srt.utils.common import build_server_info, msgspec_to_builtins

given = json.load(open(sys.argv[1]))
parser = argparse.ArgumentParser(prog="sglang serve")  # as prepare_server_args makes it
sa.ServerArgs.add_cli_args(parser)
server_args = sa.ServerArgs.from_cli_args(parser.parse_args(sys.argv[2:]))
info = {**build_server_info(server_args, given["scheduler_info"]),
        "startup_time": given["scheduler_info"].get("startup_time"),
        "internal_states": given["internal_states"], "version": "0.5.23", "frontend": "python"}
print(json.dumps({"server_info": msgspec_to_builtins(info), "help": parser.format_help()},
                 default=str))
