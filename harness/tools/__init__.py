"""Tools the harness runs. `calls`: run a command as a recorded tool call (`ToolInvoked`:
argv, cwd, environment digest without secret values, exit code, outputs as artifacts, repo
state); the tools to come (build, profile, diagnose, monitor) live here too."""
