"""Views: plain-text tables and verdicts for people, from the contract's records (never raw agent keys).
"""
