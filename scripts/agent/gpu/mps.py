"""CUDA MPS: know the control daemon and its server, say whom the server serves, and quit it.

Why: under MPS (`nvidia-cuda-mps-control -d`) the CUDA contexts of every client live in
one `nvidia-cuda-mps-server` process, which NVML lists as a compute process (66 MiB on an
H200 with one torch client) and which stays after its clients exit, until the control
daemon is told `quit`. Treated as an ordinary holder, it would be killed under a live
control daemon, or `verify` would wait forever on "an unknown holder". So: the control
daemon and the server are protected (builtin.PROTECTED_NAMES); status shows each server
and its clients (or none); verify names memory held by a server without clients as that;
and `teardown --mps quit` sends `quit` through the daemon's control pipe, as the daemon's
own user, and waits for its server to go.

The whole account: docs/design-notes.md (scripts/agent/gpu/mps.py)."""
import os
import shutil
import stat
import subprocess
import time

from ..policy import rules
from ..wire import defaults

CONTROL = "nvidia-cuda-mps-control"
SERVER = "nvidia-cuda-mps-server"
DEFAULT_PIPE_DIR = "/tmp/nvidia-mps"
PIPE_ENV = "CUDA_MPS_PIPE_DIRECTORY"
QUIT_TIMEOUT_S = defaults.MPS_QUIT_TIMEOUT_S
POLL_S = 0.05
CLIENT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # the quit client's environment


def _program(proc):
    argv = proc.get("argv") or []
    return os.path.basename(argv[0]) if argv else proc.get("comm") or ""


def _runs(proc, name):
    """Does the process run the root-owned program `name`? (Its names first: the cheap filter.)"""
    if _program(proc) != name and (proc.get("comm") or "") != name[:15]:
        return False
    exe = rules.root_owned_exe(proc["pid"])
    return bool(exe) and os.path.basename(exe) == name


def is_control(proc):
    return _runs(proc, CONTROL)


def is_server(proc):
    return _runs(proc, SERVER)


def pipe_dir(pid):
    """The control daemon's pipe directory: its CUDA_MPS_PIPE_DIRECTORY, else MPS's default."""
    try:
        with open("/proc/%d/environ" % pid, "rb") as f:
            for item in f.read().split(b"\0"):
                if item.startswith(PIPE_ENV.encode() + b"="):
                    return item.split(b"=", 1)[1].decode("utf-8", "replace") or DEFAULT_PIPE_DIR
    except OSError:
        pass
    return DEFAULT_PIPE_DIR


def mps_clients(source):
    """{gpu index: [pid]} from NVML's MPS process list, or None where it cannot be read."""
    if getattr(source, "name", None) != "nvml":
        return None
    out = {}
    try:
        for index, h in enumerate(source.handles):
            procs = source.nvml.mps_processes(h)
            if not isinstance(procs, list):  # nvml.NA: an old driver or binding
                return None
            out[index] = [pid for pid, _ in procs]
    except Exception:
        return None
    return out


def describe(procs, gpus, source=None):
    """{controls: [...], servers: [{pid, uid, control, pipe_dir, gpus: {idx: MiB}, clients: [...]}]}
    or None where MPS does not run. procs: scan's /proc table; gpus: the GPU rows."""
    controls = [p for p in procs.values() if is_control(p)]
    servers = [p for p in procs.values() if is_server(p)]
    if not controls and not servers:
        return None
    nvml_clients = mps_clients(source) if servers else None
    server_pids = {s["pid"] for s in servers}
    out_servers = []
    for s in servers:
        on = {g["index"]: p["used_mib"] for g in gpus for p in g["processes"] if p["pid"] == s["pid"]}
        clients: list = []
        for g in gpus:
            if g["index"] not in on:
                continue
            listed = [(pid, "NVML MPS process list") for pid in (nvml_clients or {}).get(g["index"], [])]
            listed += [(p["pid"], "another compute process on the same GPU") for p in g["processes"]]
            for pid, via in listed:
                if pid in server_pids or any(c["pid"] == pid for c in clients):
                    continue
                info = procs.get(pid) or {}
                clients.append({"pid": pid, "gpu": g["index"], "cmdline": info.get("cmdline", "(not visible here)"),
                                "via": via})
        control = next((c for c in controls if c["pid"] == s["ppid"]), None)
        out_servers.append({"pid": s["pid"], "uid": s.get("uid"), "start_time": s["start_time"],
                            "control": control["pid"] if control else None,
                            "pipe_dir": pipe_dir(control["pid"]) if control else None,
                            "gpus": {str(k): v for k, v in on.items()}, "clients": clients})
    return {"controls": [{"pid": c["pid"], "uid": c.get("uid"), "start_time": c["start_time"],
                          "pipe_dir": pipe_dir(c["pid"]), "cmdline": c.get("cmdline")} for c in controls],
            "servers": out_servers}


def idle_servers(info):
    """{pid: server} of MPS servers holding GPU memory with no client."""
    return {s["pid"]: s for s in (info or {}).get("servers", []) if not s["clients"]}


def problem_line(gpu, proc, server):
    """verify's line for GPU memory an MPS server keeps with no client."""
    return ("GPU %s: MPS server pid %s keeps %s MiB with no client (the CUDA MPS daemon holds it until told to quit: "
            "`invoke teardown --mps quit`, or `echo quit | nvidia-cuda-mps-control` with CUDA_MPS_PIPE_DIRECTORY=%s)"
            % (gpu, proc["pid"], proc["used_mib"], server.get("pipe_dir") or DEFAULT_PIPE_DIR))


class PipeRefused(Exception):
    """The pipe directory is not the daemon's own: nothing is sent."""


def check_pipe_dir(path, uid):
    """Raise PipeRefused unless path and its control pipe are real (no link) and belong to uid or root."""
    for p in (path, os.path.join(path, "control")):
        try:
            st = os.lstat(p)
        except OSError as exc:
            raise PipeRefused("%s: %s" % (p, exc.strerror)) from None
        if stat.S_ISLNK(st.st_mode):
            raise PipeRefused("%s is a symbolic link: not the MPS daemon's pipe" % p)
        if st.st_uid not in (0, uid):
            raise PipeRefused("%s belongs to uid %d, not the MPS daemon's user (uid %s)" % (p, st.st_uid, uid))


def _as_user(uid):
    """preexec_fn running the client as the daemon's user (root agent, another user's daemon)."""
    if os.geteuid() != 0 or uid in (None, 0):
        return None
    import pwd

    try:
        gid = pwd.getpwuid(uid).pw_gid
    except KeyError:
        gid = uid

    def drop():
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)

    return drop


def client_program(pid):
    """The MPS client to send `quit` with: on PATH, else the daemon's own executable when it is a
    root-owned file still at its path (the same file the daemon runs); never /proc/PID/exe."""
    found = shutil.which(CONTROL)
    if found:
        return found
    path = rules.root_owned_exe(pid)
    if not path or os.path.basename(path) != CONTROL:
        return None
    try:
        same = path and os.path.samestat(os.stat(path), os.stat("/proc/%d/exe" % pid))
    except OSError:
        same = False
    return path if same else None


def quit_daemon(control, servers, timeout_s=QUIT_TIMEOUT_S, exe=None):
    """Send `quit` to one control daemon and wait for its server(s) to exit, all within
    timeout_s. Returns a record {control, pipe_dir, sent, output, servers_gone, waited_s, error}."""
    from ..procs import procfs

    rec = {"control": control["pid"], "pipe_dir": control["pipe_dir"], "sent": False, "output": "",
           "servers_gone": False, "waited_s": 0.0, "error": None}
    if timeout_s <= 0:
        rec["error"] = "not sent: the --mps quit time (%g s for all daemons) was spent" % QUIT_TIMEOUT_S
        return rec
    try:
        check_pipe_dir(control["pipe_dir"], control.get("uid"))
    except PipeRefused as exc:
        rec["error"] = "refused: %s" % exc
        return rec
    exe = exe or client_program(control["pid"])
    if not exe:
        rec["error"] = "%s not found on PATH" % CONTROL
        return rec
    env = {"PATH": CLIENT_PATH, "LANG": "C", PIPE_ENV: control["pipe_dir"]}  # not the agent's environment
    t0 = time.monotonic()
    try:
        done = subprocess.run([exe], input="quit\n", capture_output=True, text=True, env=env, timeout=timeout_s,
                              preexec_fn=_as_user(control.get("uid")))
        rec["sent"] = done.returncode == 0
        rec["output"] = (done.stdout + done.stderr).strip()[:400]
        if done.returncode:
            rec["error"] = "%s exited %d" % (CONTROL, done.returncode)
    except (OSError, subprocess.SubprocessError) as exc:
        rec["error"] = "%s: %s" % (CONTROL, exc)
        rec["waited_s"] = round(time.monotonic() - t0, 3)
        return rec
    mine = [(s["pid"], s["start_time"]) for s in servers if s.get("control") == control["pid"]]
    while time.monotonic() - t0 < timeout_s:
        if not any(procfs.same_process(pid, start) for pid, start in mine):
            rec["servers_gone"] = True
            break
        time.sleep(POLL_S)
    rec["waited_s"] = round(time.monotonic() - t0, 3)
    if not rec["servers_gone"]:
        rec["error"] = "the MPS server did not exit within %g s after quit" % timeout_s
    return rec


def quit_all(info, audit=None, timeout_s=QUIT_TIMEOUT_S, skip=None):
    """`--mps quit`: quit every control daemon seen (each logged to the audit log), all within
    one timeout_s. skip: {control pid: why} for daemons left running (their server has clients)."""
    out = []
    deadline = time.monotonic() + timeout_s
    for control in (info or {}).get("controls", []):
        why = (skip or {}).get(control["pid"])
        if why:
            rec = {"control": control["pid"], "pipe_dir": control["pipe_dir"], "sent": False, "output": "",
                   "servers_gone": False, "waited_s": 0.0, "error": "not sent: " + why}
        else:
            rec = quit_daemon(control, info.get("servers", []), deadline - time.monotonic())
        if audit is not None:
            audit.log({"pid": control["pid"], "start_time": control["start_time"], "cmdline": control.get("cmdline")},
                      "mps quit", "servers gone" if rec["servers_gone"] else (rec["error"] or "sent"))
        out.append(rec)
    return out
