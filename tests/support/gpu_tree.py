"""A real torch "server" tree for the GPU tests and benchmark: a parent and spawned
children, each holding memory on every GPU, like SGLang's scheduler workers.

  python3 tests/support/gpu_tree.py --token TOKEN --children 3 --gib 20 --ready FILE
The parent writes "PARENT CHILD..." to FILE once every process holds its memory.
"""
import argparse
import multiprocessing as mp
import os
import time


def hold(gib, ready_q):
    import torch

    blocks = [torch.empty(int(gib * 2**30), dtype=torch.uint8, device=f"cuda:{i}")
              for i in range(torch.cuda.device_count())]
    torch.cuda.synchronize()
    ready_q.put(os.getpid())
    while True:
        time.sleep(3600)
    return blocks


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--token", required=True)
    p.add_argument("--children", type=int, default=3)
    p.add_argument("--gib", type=float, default=2.0)
    p.add_argument("--ready", required=True)
    args = p.parse_args()
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    kids = [ctx.Process(target=hold, args=(args.gib, q)) for _ in range(args.children)]
    for k in kids:
        k.start()
    import torch

    mine = [torch.empty(int(args.gib * 2**30), dtype=torch.uint8, device=f"cuda:{i}")
            for i in range(torch.cuda.device_count())]
    torch.cuda.synchronize()
    pids = [q.get(timeout=300) for _ in kids]
    with open(args.ready + ".tmp", "w") as f:
        f.write(" ".join(map(str, [os.getpid(), *pids])))
    os.replace(args.ready + ".tmp", args.ready)
    while True:
        time.sleep(3600)
    return mine


if __name__ == "__main__":
    main()
