"""A teardown: the plan, the two SIGTERM batches, the fork watch, the wait, verify and the
settle window, the host lock and the unit or container stops.
"""
