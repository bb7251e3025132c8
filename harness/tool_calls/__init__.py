"""Tool calls: commands the harness runs and records. `calls`: run a command as a recorded
tool call (`ToolInvoked`: argv, cwd, environment digest without secret values, exit code,
outputs as artifacts, repo state); `build`: `forge build`, a recorded call cached by the
digest of its inputs. (The tools an agent is given live in `harness/agents/`; the tools the
MCP server offers in `harness/mcp/`.)"""
