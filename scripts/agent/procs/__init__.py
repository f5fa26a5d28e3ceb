"""Processes on the host: /proc read by identity, in forked workers; what program a process is,
what wraps it, which unit or container it is in, and who holds each GPU.
"""
