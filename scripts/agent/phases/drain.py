"""Wait until a running server has no in-flight requests (bounded), read from /metrics.

Why: a pivot should not cut off requests mid-generation when it does not have to. SGLang
exports `sglang:num_running_reqs`, vLLM `vllm:num_requests_running` (Prometheus text);
each may carry labels and appear once per engine, so the samples are summed.

Drained means one thing only: a read of /metrics that succeeded and showed 0 requests in
flight. An error (HTTP 500, refused, a time-out) or a page without the metric proves
nothing, so it is NOT drained (exit 1) and the pivot stops before its teardown: taking
"no answer" for "nothing to drain" once tore a busy server down. The operator who knows
better says `--no-drain`.
"""
import time
import urllib.request

from ..options.record import Options
from ..wire import codes, records

METRICS = ("sglang:num_running_reqs", "vllm:num_requests_running")


def add_arguments(parser):
    parser.add_argument("--url", required=True, help="the server's /metrics URL")
    parser.add_argument("--timeout", type=float, default=300.0)


def running_requests(text):
    """Sum of the in-flight request gauges in Prometheus text, or None when none is present."""
    total, seen = 0.0, False
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(None, 1)[0]
        if name not in METRICS:
            continue
        rest = line.rsplit("}", 1)[1].split() if "}" in line else line.split()[1:]
        try:  # `name{labels} value [timestamp]`
            total += float(rest[0])
            seen = True
        except (ValueError, IndexError):
            continue
    return total if seen else None


FETCH_TIMEOUT_S = 3.0


def fetch(url, timeout=FETCH_TIMEOUT_S):
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return resp.read().decode("utf-8", "replace")


def run(opts: Options):
    code, doc = _drain(opts.url, opts.timeout, opts.emit_progress)
    return code, records.written(records.DrainResult, doc, code=code)


def _drain(url, timeout, emit):
    started = time.monotonic()
    last = None
    while True:
        waited = time.monotonic() - started
        try:
            count = running_requests(fetch(url, max(0.5, min(FETCH_TIMEOUT_S, timeout - waited))))
        except Exception as exc:  # HTTP error, refused, time-out: nothing proves the server is idle
            note = "could not read %s (%s): not drained" % (url, exc)
            return codes.EXIT_FAILED, {"drained": False, "note": note,
                                          "waited_s": round(time.monotonic() - started, 2)}
        waited = time.monotonic() - started
        if count is None:
            note = "no in-flight request metric at %s (%s): not drained" % (url, " or ".join(METRICS))
            return codes.EXIT_FAILED, {"drained": False, "note": note, "waited_s": round(waited, 2)}
        if count == 0:
            return codes.EXIT_OK, {"drained": True, "running": 0, "waited_s": round(waited, 2)}
        if waited >= timeout:
            return codes.EXIT_FAILED, {"drained": False, "running": count, "waited_s": round(waited, 2)}
        if count != last:
            emit(phase="drain", elapsed_s=round(waited, 1), running=count)
            last = count
        time.sleep(1.0)
