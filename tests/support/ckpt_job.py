"""A training job for the checkpoint-stop tests (agent/teardown/checkpoint.py): run as
`python ckjob.py SPEC.json`, it holds a fake GPU device, writes its pid to SPEC["ready"], and on
SIGUSR1 checkpoints as SPEC["mode"] says (slow, quick, hold, foreign, link, idle, stubborn),
logging each step to SPEC["log"]; SIGTERM ends it ("term while open" with a checkpoint open),
except in mode stubborn."""

JOB = """\
import json, os, signal, sys, time
spec = json.load(open(sys.argv[1]))
log = open(spec["log"], "a", buffering=1)
gpu = os.open(spec["device"], os.O_RDWR)  # holds a (fake) GPU: a target of the teardown
if spec.get("child"):  # a worker with no handler for the stop's signal, as a DataLoader worker
    import subprocess
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", sys.argv[1]])  # in scope
    with open(spec["child"] + ".tmp", "w") as f:
        f.write(str(worker.pid))
    os.rename(spec["child"] + ".tmp", spec["child"])
asked, open_ckpt = [], []
signal.signal(signal.SIGUSR1, lambda *_: asked.append(1))
def on_term(*_):
    log.write("term while open\\n" if open_ckpt else "term\\n")
    os._exit(0)
signal.signal(signal.SIGTERM, signal.SIG_IGN if spec["mode"] == "stubborn" else on_term)
def done():
    open(spec["done"], "w").close()
with open(spec["ready"] + ".tmp", "w") as f:
    f.write(str(os.getpid()))
os.rename(spec["ready"] + ".tmp", spec["ready"])
while not asked:
    time.sleep(0.02)
log.write("usr1\\n")
mode, path = spec["mode"], spec["ckpt"]
if mode in ("slow", "hold", "quick"):
    f = open(path, "wb")
    open_ckpt.append(f)
    f.write(b"weights" * 1000)
    f.flush()
    log.write("open\\n")
    if mode == "hold":
        done()
    while mode == "slow" and not os.path.exists(spec["go"]):
        time.sleep(0.02)
    if mode != "hold":
        f.close()
        open_ckpt.clear()
        log.write("closed\\n")
elif mode == "foreign":  # a new closed file of the right name, owned by another uid
    with open(path, "wb") as f:
        f.write(b"weights")
    os.chown(path, spec["uid"], -1)
    done()
elif mode == "link":  # a new closed file of its own, reached through a link that matches the glob
    with open(spec["elsewhere"], "wb") as f:
        f.write(b"weights")
    os.symlink(spec["elsewhere"], path)
    done()
elif mode == "idle":
    done()
while True:
    time.sleep(0.05)
"""
