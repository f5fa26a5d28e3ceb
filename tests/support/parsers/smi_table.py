"""Parse the human `nvidia-smi` table (test-only: the captures in tests/fixtures).

Why: it shows the trap of `nvidia-smi | grep "0MiB" | wc -l`: on a loaded H200 the
per-process rows read "21090MiB", so that count says 4 free GPUs on one full GPU. Here a
GPU is free only when its own memory row reads 0 MiB used and no process is on it. The
agent never reads this table (it uses NVML or the --query CSV, scripts/agent/gpu/smi_parse.py).
"""
import re

_TABLE_GPU = re.compile(r"^\|\s+(\d+)\s+(.+?)\s+(?:On|Off)\s+\|")
_TABLE_MEM = re.compile(r"(\d+)MiB\s*/\s*(\d+)MiB")
_TABLE_PROC = re.compile(r"^\|\s+(\d+)\s+\S+\s+\S+\s+(\d+)\s+(\S+)\s+(.+?)\s+(\d+)MiB\s*\|$")


def table(text):
    """The human `nvidia-smi` table -> {'gpus': [...], 'processes': [...], 'free': [indexes]}.

    For pasted output only: the agent itself reads the CSV queries or NVML.
    """
    gpus, procs, pending = [], [], None
    for line in text.splitlines():
        m = _TABLE_GPU.match(line)
        if m:
            pending = {"index": int(m.group(1)), "name": m.group(2).strip()}
            continue
        m = _TABLE_MEM.search(line)
        if pending is not None and m:
            pending.update(used_mib=int(m.group(1)), total_mib=int(m.group(2)))
            gpus.append(pending)
            pending = None
            continue
        m = _TABLE_PROC.match(line.rstrip())
        if m:
            procs.append({"gpu": int(m.group(1)), "pid": int(m.group(2)), "type": m.group(3),
                          "name": m.group(4).strip(), "used_mib": int(m.group(5))})
    busy = {p["gpu"] for p in procs}
    free = [g["index"] for g in gpus if g["used_mib"] == 0 and g["index"] not in busy]
    return {"gpus": gpus, "processes": procs, "free": free}
