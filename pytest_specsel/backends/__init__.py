"""Backends behind the core's protocols (``core.protocol``): the scripted fake, backend-neutral asset
resolution and the model cache, and ``vllm/``. May import: ``core``.
"""
