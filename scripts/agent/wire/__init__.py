"""What crosses between the local side and the agent, defined once for both: the agent's argv
(call), the framing of its output (frame), exit codes (codes), shared defaults (defaults),
and the typed records the agent writes its results as and the local side reads them into
(records, with rows: their TypedDicts, for mypy only). The byte encoding of host text is the
agent's (procs/textsafe.py), imported by both sides beside this.

Why a package of its own: each side imports of the other only this (and the shared /proc and
state-directory primitives), so the agent imports nothing of the local side, and the wire
imports nothing of the agent outside it (tests/test_layers.py keeps both). Standard library
only, Python 3.8 syntax: the parts the agent uses ship in its bundle.
"""
