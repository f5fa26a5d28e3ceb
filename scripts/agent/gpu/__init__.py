"""The GPUs themselves: memory (NVML, else nvidia-smi), health, Xid events, MIG, CUDA MPS, reset.
"""
