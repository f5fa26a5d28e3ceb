"""Operations: a pivot and its phase steps, the fleet fan-out, the local audit log, the sandbox host.
"""
