"""What crosses between the local side and the agent, defined once for both: the agent's argv
(call), its output's framing (frame), exit codes (codes), shared defaults (defaults), the typed
records of its results (records; rows: their TypedDicts, for mypy only). Host text's byte
encoding is the agent's (procs/textsafe.py), imported by both sides beside this.

Why a package of its own: each side imports of the other only this (and the shared /proc and
state-directory primitives): the agent imports nothing of the local side, the wire nothing of
the agent outside it (tests/test_layers.py). Stdlib only, Python 3.8: it ships in the bundle.
"""
