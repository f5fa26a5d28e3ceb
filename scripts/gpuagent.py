#!/usr/bin/env python3
"""Run the gpu-pivot agent directly on a host: `python3 scripts/gpuagent.py ping --json`.

The transport does not use this file: it ships the same `agent` package over stdin
(scripts/reach/bundle.py), so nothing has to be installed on the host.
"""
import os
import sys

if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from agent.cli import main

    sys.exit(main())
