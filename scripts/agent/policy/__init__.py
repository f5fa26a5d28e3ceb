"""What a process is and what may be done to it: what program it runs, what wraps it, which
manager stops it, who could start it again, which are targets and which are protected, and
the built-in selection. Above procs/, which reads /proc; nothing here reads a GPU.
"""
