"""Parse nvidia-smi: the --query CSV (what the agent uses) and the human table (pasted).

Why not grep: `nvidia-smi | grep "0MiB" | wc -l` counts every line containing "0MiB",
and on a loaded H200 the per-process rows read "21090MiB": 4 "free" GPUs on one full GPU.
Here a GPU is free only when its own memory row reads 0 MiB used and no process is on it.
"""
import re

GPU_FIELDS = ("index", "uuid", "name", "memory.used", "memory.total", "memory.reserved")
APP_FIELDS = ("gpu_uuid", "pid", "process_name", "used_memory")
GPU_QUERY = ["nvidia-smi", "--query-gpu=" + ",".join(GPU_FIELDS), "--format=csv,noheader,nounits"]
APP_QUERY = ["nvidia-smi", "--query-compute-apps=" + ",".join(APP_FIELDS), "--format=csv,noheader,nounits"]


def _number(text):
    """'21090', '21090 MiB' -> 21090; '[N/A]', '[Not Supported]' -> None."""
    text = text.strip()
    m = re.match(r"^(\d+)(?:\s*MiB)?$", text)
    return int(m.group(1)) if m else None


def _rows(text, width):
    """Split CSV rows of `width` columns; the one free-text column may hold ', '."""
    out = []
    for line in text.splitlines():
        if not line.strip():
            continue
        cells = [c.strip() for c in line.split(",")]
        if len(cells) < width:
            raise ValueError("nvidia-smi CSV row has %d columns, expected %d: %r" % (len(cells), width, line))
        out.append(cells)
    return out


def _is_header(cells, first_field):
    return cells[0].split(" ")[0] == first_field


def query_gpu(text):
    """Rows of `--query-gpu=index,uuid,name,memory.used,memory.total,memory.reserved`."""
    gpus = []
    for cells in _rows(text, len(GPU_FIELDS)):
        if _is_header(cells, "index"):
            continue
        extra = len(cells) - len(GPU_FIELDS)  # commas inside the name
        name = ", ".join(cells[2:3 + extra])
        used, total, reserved = cells[3 + extra:6 + extra]
        gpus.append({"index": int(cells[0]), "uuid": cells[1], "name": name, "used_mib": _number(used),
                     "total_mib": _number(total), "reserved_mib": _number(reserved)})
    return gpus


def query_compute_apps(text):
    """Rows of `--query-compute-apps=gpu_uuid,pid,process_name,used_memory`."""
    apps = []
    for cells in _rows(text, len(APP_FIELDS)):
        if _is_header(cells, "gpu_uuid"):
            continue
        apps.append({"gpu_uuid": cells[0], "pid": int(cells[1]), "name": ", ".join(cells[2:-1]),
                     "used_mib": _number(cells[-1])})
    return apps


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
