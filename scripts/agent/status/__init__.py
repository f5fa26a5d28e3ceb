"""The read-only subcommands: who holds each GPU (scan, the holders/ engine's document with
health beside it) and what the host has (ping). Above holders/, gpu/ and state/, which they
read; beside teardown/ and phases/, which read the same engine."""
