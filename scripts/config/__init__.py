"""Configuration: hosts.env read strictly, ssh options, node sets, phases, defaults and bad-input errors.

The lowest local layer: it reaches no host and imports nothing of the layers above.
"""
