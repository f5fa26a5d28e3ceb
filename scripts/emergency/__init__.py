"""The emergency teardown: one shell command that needs no gpu-pivot on the host, its report
reader, and the runbook made from it.
"""
