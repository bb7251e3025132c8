"""Agents in the harness: the tool registry (tools.py) the MCP server and the agent executor
share, model tiers and calls (models.py), skills, review."""
