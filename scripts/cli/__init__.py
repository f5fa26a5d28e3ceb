"""The Invoke tasks, a few per module; tasks.py gathers them into one flat namespace.

Why split: each module is small enough to read at once, and imports only Invoke and
scripts.config.defaults when it loads. A task imports what it uses (transport, hosts.env
parsing, ClusterShell, the sandbox, the pivot) when it runs, so `invoke --list` and
`invoke --help TASK` pay for none of that. Logic stays in scripts/, rendering in the views.
"""
