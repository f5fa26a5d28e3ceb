"""Parse nvidia-smi's --query CSV: the agent's GPU memory source where NVML is missing.

Why not grep: `nvidia-smi | grep "0MiB" | wc -l` counts every line containing "0MiB",
and on a loaded H200 the per-process rows read "21090MiB": 4 "free" GPUs on one full GPU.
Here a GPU's memory comes from its own CSV row, and each process from its own. (The human
table's parser, for pasted output and the captures, is test-only: tests/support/parsers/smi_table.py.)
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
