"""A torch "server" holding GPU memory and a pinned host-memory pool, as SGLang's hierarchical
cache pins hundreds of GB: its exit spends seconds unpinning after the GPU reads free.

  python3 tests/support/gpu_pinned_server.py --token TOKEN --gpu-gib 120 --pinned-gib 48 --ready FILE
Writes its pid to FILE once both are held.
"""
import argparse
import os
import time


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--token", required=True)
    p.add_argument("--gpu-gib", type=float, default=8.0)
    p.add_argument("--pinned-gib", type=float, default=16.0)
    p.add_argument("--ready", required=True)
    args = p.parse_args()
    import torch

    on_gpu = torch.empty(int(args.gpu_gib * 2**30), dtype=torch.uint8, device="cuda:0")
    chunk = 2**30
    pinned = [torch.empty(chunk, dtype=torch.uint8, pin_memory=True) for _ in range(int(args.pinned_gib))]
    for block in pinned:
        block.fill_(1)  # touched: every page is resident and pinned
    torch.cuda.synchronize()
    with open(args.ready + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(args.ready + ".tmp", args.ready)
    while True:
        time.sleep(3600)
    return on_gpu, pinned


if __name__ == "__main__":
    main()
