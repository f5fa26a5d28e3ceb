"""Processes on the host: /proc read by identity, in forked workers; which unit or container a
process is in, and who holds each GPU device. Readers only: what a process is and what may be
done to it is policy/'s.
"""
