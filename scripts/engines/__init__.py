"""Engines that run gpu-pivot for a scheduler or a configuration tool: the Slurm epilog, prolog
and undrain, and the Ansible task.
"""
