"""The options record of one agent run (record.py) and the flags several subcommands share
(flags.py): the entry points' alone."""
