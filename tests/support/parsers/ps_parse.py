"""Parse `ps -eo pid,ppid,pgid,sid,stat,comm,args [--forest]` output (test-only).

Why: the capture of a loaded H200's process tree (tests/fixtures/.../ps-tree-loaded.txt)
is read with it, to pin down the tree shape (a holder and its spawned workers in one
process group) that the agent's own /proc scan must handle. The two COMMAND columns are
split by the header's offsets; the forest art is removed. gpu-pivot itself never runs ps.
"""
import re

_ART = re.compile(r"^[\s|\\_]*")


def parse(text):
    lines = text.splitlines()
    if not lines:
        return []
    header = lines[0]
    first = header.index("COMMAND")
    second = header.index("COMMAND", first + 1) if "COMMAND" in header[first + 1:] else None
    rows = []
    for line in lines[1:]:
        if not line.strip():
            continue
        fields = line[:first].split()
        if len(fields) < 5:
            raise ValueError("ps row has too few columns: %r" % line)
        comm_part = line[first:second] if second else line[first:]
        args_part = line[second:] if second else comm_part
        rows.append({"pid": int(fields[0]), "ppid": int(fields[1]), "pgid": int(fields[2]), "sid": int(fields[3]),
                     "stat": fields[4], "state": fields[4][0],
                     "comm": _ART.sub("", comm_part).strip(), "args": _ART.sub("", args_part).strip()})
    return rows


def children(rows, pid):
    return [r["pid"] for r in rows if r["ppid"] == pid]
