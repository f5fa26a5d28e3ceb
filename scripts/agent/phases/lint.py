"""Lint a server's launch command on the host, before it starts, for known mistakes.

Why: an EAGLE-3 draft model was once run with `--speculative-algorithm EAGLE`; SGLang's
is_eagle3() check only accepts "EAGLE3", so the draft got the wrong hidden states and the
acceptance length stayed at 1.0 for days. Also caught: tensor parallel size above the
GPUs visible, the port already taken, a model or draft path that does not exist, and
GPUs that are not free. Findings are errors; the caller blocks the start unless --force.
"""
import errno
import json
import os
import socket

from ..holders import scan
from ..options.record import Options
from ..teardown import verify
from ..wire import codes, records

TP_FLAGS = ("--tp", "--tp-size", "--tensor-parallel-size", "-tp")
PORT_FLAGS = ("--port",)
MODEL_FLAGS = ("--model-path", "--model")
DRAFT_FLAGS = ("--speculative-draft-model-path", "--speculative-draft-model", "--speculative-draft")
ALGO_FLAGS = ("--speculative-algorithm", "--speculative-algo")


def add_arguments(parser):
    parser.add_argument("--argv", required=True, help="the launch command, as a JSON array")
    parser.add_argument("--gpus", default=None, help="CUDA_VISIBLE_DEVICES the phase will get")


def flag(argv, names):
    """Value of the last `--flag value` or `--flag=value` among names, else None."""
    value = None
    for i, arg in enumerate(argv):
        for name in names:
            if arg == name and i + 1 < len(argv):
                value = argv[i + 1]
            elif arg.startswith(name + "="):
                value = arg.split("=", 1)[1]
    return value


def _looks_like_path(value):
    return value.startswith(("/", "./", "../", "~"))


def _speculative_config(argv):
    """vLLM's --speculative-config JSON: (method, model)."""
    raw = flag(argv, ("--speculative-config",))
    if not raw:
        return None, None
    try:
        cfg = json.loads(raw)
    except ValueError:
        return None, None
    return cfg.get("method"), cfg.get("model")


def draft_is_eagle3(path):
    try:
        with open(os.path.join(os.path.expanduser(path), "config.json")) as f:
            cfg = json.load(f)
    except (OSError, ValueError):
        return False
    return any("eagle3" in str(a).lower() for a in cfg.get("architectures") or [])


def port_taken(port):
    """Is something listening on the port? SO_REUSEADDR as servers set it, so connections
    in TIME_WAIT (e.g. our own health probes) do not count as taken."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
        except OSError as exc:
            return exc.errno == errno.EADDRINUSE
    return False


def findings(argv, gpus_visible, gpus_env, free_problems):
    out = []

    def add(check, message):
        out.append({"check": check, "message": message})

    algo = flag(argv, ALGO_FLAGS)
    draft = flag(argv, DRAFT_FLAGS)
    method, vllm_draft = _speculative_config(argv)
    if draft and algo and algo.upper() == "EAGLE" and draft_is_eagle3(draft):
        add("speculative-algorithm", "draft model %s is EAGLE-3 (config.json architectures) but "
            "--speculative-algorithm EAGLE was given: use EAGLE3, or the acceptance length stays at 1.0" % draft)
    if vllm_draft and method and method.lower() == "eagle" and draft_is_eagle3(vllm_draft):
        add("speculative-algorithm",
            "draft model %s is EAGLE-3 but --speculative-config method is 'eagle': use 'eagle3'" % vllm_draft)
    tp = flag(argv, TP_FLAGS)
    visible = len(gpus_env.split(",")) if gpus_env else gpus_visible
    if tp is not None:
        try:
            if int(tp) > visible:
                add("tensor-parallel", "tensor parallel size %s is larger than the %d GPU(s) visible" % (tp, visible))
        except ValueError:
            add("tensor-parallel", "tensor parallel size %r is not a number" % tp)
    port = flag(argv, PORT_FLAGS)
    if port is not None and port.isdigit() and port_taken(int(port)):
        add("port", "port %s is already taken on this host" % port)
    for names, what in ((MODEL_FLAGS, "model"), (DRAFT_FLAGS, "draft model")):
        value = flag(argv, names)
        if value and _looks_like_path(value) and not os.path.exists(os.path.expanduser(value)):
            add("path", "%s path %s does not exist" % (what, value))
    if vllm_draft and _looks_like_path(vllm_draft) and not os.path.exists(os.path.expanduser(vllm_draft)):
        add("path", "draft model path %s does not exist" % vllm_draft)
    for problem in free_problems:
        add("gpus-free", problem)
    return out


def run(opts: Options):
    if opts.argv is None:  # the parser requires it; a record made without it is bad input too
        raise codes.UsageError("--argv: the launch command is required")
    argv = json.loads(opts.argv)
    doc = scan.collect(opts.selection)
    free, problems = verify.evaluate(doc, opts.max_used_mib)
    visible = len(doc["gpus"]) or len([d for d in doc["devices"] if os.path.basename(d)[6:].isdigit()])
    found = findings(argv, visible, opts.gpus, [] if free else problems)
    code = codes.EXIT_OK if not found else codes.EXIT_GATE
    return code, records.written(records.LintResult, {"ok": not found}, code=code, findings=found, gpus_visible=visible)
