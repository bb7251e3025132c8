"""What an agent is given, below the loop: model tiers and calls (models.py), the prompts'
views of a task (context.py), skills (skills.py), the tool registry (tool_registry.py) and the
tools that need no loop (task_tools.py, approval_tool.py, skills.py). The agent executor and
review are the loop's (harness/loop/); the MCP server is harness/mcp/."""
