"""The pytest glue: hooks, fixtures, options, the session plugin, outcome mapping, terminal and json-
report output. May import everything below it; nothing imports it but the entry point.
"""
