"""A phase on the host (a server, a training job): run it so it outlives ssh, drain it, gate and
lint its start, deploy a patch.
"""
