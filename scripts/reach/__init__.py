"""Reaching a host: routes (ssh, `pct exec`), the one runner for every command sent over a route,
the agent's bundle and transport, an operator's remote command.
"""
