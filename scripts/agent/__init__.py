"""The gpu-pivot agent: runs on the GPU host, standard library only, Python >= 3.8.

It is shipped over stdin (`python3 - SUBCOMMAND ...`) by scripts/reach/bundle.py, or run as
`python3 scripts/gpuagent.py SUBCOMMAND`. Modules use relative imports so both work.
The bundle carries the modules cli.py reaches by import, nothing else. What the local side
and the agent agree on is wire/: with the shared /proc and state-directory primitives, all the
local side imports from here.
"""
