"""Which agent module runs each subcommand: the one table the agent's command line (cli.py)
imports a subcommand's module from, and the bundle (scripts/reach/bundle.py) ships by.

Why names, not imports: a subcommand's module is imported only when it is the one asked for
(a teardown, timed to FREED, does not pay for ping's socket or the phases' urllib), and a
call ships only the modules its subcommand can import (a status or a verify carries no
teardown or phase code). Plain data with no imports: the local side reads it on every call.
Each entry: (the module, dotted within the agent; the class in it that runs the subcommand,
or None for the module itself). Every module has add_arguments(parser) and run(args).
"""

MODULES = {
    "ping": ("status.ping", None),
    "scan": ("status.scan", None),
    "verify": ("teardown.verify", None),
    "plan": ("teardown.plan", None),
    "teardown": ("teardown.run", None),
    "phase-start": ("phases.run", "Start"),
    "phase-ready": ("phases.run", "Ready"),
    "phase-stop": ("phases.run", "Stop"),
    "phase-logs": ("phases.run", "Logs"),
    "smoke": ("phases.run", "Smoke"),
    "drain": ("phases.drain", None),
    "gates": ("phases.gates", None),
    "lint": ("phases.lint", None),
    "deploy": ("phases.deploy", None),
    "reset": ("teardown.reset", None),
}
