"""Parsers only tests use (captured tool output); they do not ship in the agent bundle."""
