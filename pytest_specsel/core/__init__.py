"""The pure decision core: records, the study as records, families, admission, checkpoint identity,
measurement records, statistics, intervals, parity, evidence, decision, pairing, and the protocols
the backends implement (``protocol``). May import: the standard library, ``packaging`` and itself.
"""
