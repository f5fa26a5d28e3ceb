"""The read-only subcommands: who holds each GPU (scan: status and verify read it) and what the
host has (ping). Above procs/, gpu/ and state/, which they read; beside teardown/ and phases/,
which read the scan."""
