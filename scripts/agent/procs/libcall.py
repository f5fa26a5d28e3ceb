"""A C library call by name, or the raw system call where this glibc lacks it.

Why: the scan uses Linux calls the Python of a GPU host (3.8 and up) does not wrap: statx()
(fdstat.py: a stat that never waits on a dead file server) and getdents64() (pidrange.py:
/proc listed from any pid). glibc has each only from some version on; the system call itself
is older, and its number is the machine's.
"""
import ctypes
import os


def find(name, syscall_numbers):
    """glibc's `name` (called without argtypes: ctypes converts ints and bytes itself, ~0.4 us a
    call faster), else a call of the raw system call for this machine (`syscall_numbers`:
    {machine: number}), else None."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
    if hasattr(libc, name):
        return getattr(libc, name)
    nr = syscall_numbers.get(os.uname().machine)  # platform.machine(), without importing platform
    return None if nr is None else (lambda *a: libc.syscall(nr, *a))
