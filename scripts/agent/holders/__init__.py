"""Who holds each GPU: the scan engine (scan.py) that the scan subcommand prints and verify,
the teardown and the phases read. Above procs/, policy/, gpu/ and state/, which it combines;
below the subcommands.
"""
