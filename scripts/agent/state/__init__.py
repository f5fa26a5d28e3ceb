"""The agent's state on the host: its private directories, last.json, the audit log.
"""
