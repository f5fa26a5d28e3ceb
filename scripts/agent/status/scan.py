"""The `scan` subcommand: who holds each GPU (holders/scan.py), with the GPUs' health and
settings, the last teardown and the host lock beside it.

Exit 6 (codes.EXIT_UNINSPECTED) when some process's fds could not be read: a holder
among them would be unseen, so nothing may be called free.
"""
from ..gpu import checkup, gpuinfo
from ..holders.scan import collect
from ..options.record import Options
from ..state import lastrun, lockpeek
from ..wire import codes, records


def add_arguments(parser):
    pass  # the selection flags only (cli.py adds them)


def run(opts: Options):
    with gpuinfo.reader(opts.gpu_source) as (source, tried):  # kept open for the health pass (checkup.py)
        full = collect(opts.selection, source)
        full["gpu_source_tried"] = tried or full["gpu_source_tried"]
        checkup.annotate(full, source, since_us=checkup.last_teardown_since_us())
        checkup.annotate_settings(full, source)
    code = codes.EXIT_UNINSPECTED if full["denied"] or full["proc_hidden"] else codes.EXIT_OK
    return code, records.written(records.ScanResult, full, code=code, last_teardown=lastrun.load_summary(),
                                 lock=lockpeek.peek())
