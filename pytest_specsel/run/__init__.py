"""The selection run: preflight, the servers it starts, one round, one candidate's measurement as a
value, the run's lifecycle. May import: ``core``, ``study``, ``files``; never pytest nor a backend
implementation (the backend comes in through ``core.protocol``).
"""
