"""The host's audit log: one JSON line per signal or unit stop, appended as it happens.

Why it never raises: a teardown whose disk fills, or whose audit file was tampered
with, must still finish: the processes matter more than the log. Every record also
travels back in the result (`records`); what could not be written to the host's file
is collected in `write_errors` (one line each) for the result to report.
The file is statedir.run_dir()/audit.jsonl, opened O_NOFOLLOW and O_APPEND, created 0600.
"""
import os
import socket
import time

from ..wire import defaults
from . import statedir


class Audit:
    def __init__(self, operator, path=None):
        self.operator = operator
        self.host = socket.gethostname()
        self.records = []
        self.write_errors = []
        self.path = path
        if path is None:
            try:
                self.path = os.path.join(statedir.run_dir(), "audit.jsonl")
            except OSError as exc:
                self._failed("audit log: %s" % exc)

    def _failed(self, line):
        line = " ".join(str(line).split())  # one line, whatever the error text held
        if line not in self.write_errors:
            self.write_errors.append(line)

    def log(self, target, action, result, **extra):
        """One record; `extra`: fields beside the usual ones (a checkpoint stop's path and seconds)."""
        rec = {"time": time.strftime(defaults.TIME_FORMAT), "host": self.host, "operator": self.operator,
               "pid": target.get("pid"), "start_time": target.get("start_time"), "cmdline": target.get("cmdline"),
               "signal": action, "result": result}
        rec.update(extra)
        return self.record(rec)

    def record(self, rec):
        """Keep and append one record as it is (a GPU setting's change has no target)."""
        self.records.append(rec)
        if self.path is None:
            return rec
        try:
            statedir.append_json(self.path, rec)
        except Exception as exc:  # OSError, StateFileError, an unserialisable field: never stop the caller
            self._failed("audit log %s: %s" % (self.path, exc))
        return rec
