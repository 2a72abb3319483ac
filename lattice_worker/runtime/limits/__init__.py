"""Shared model rate limits (``LATTICE_MODEL_LIMITS``, docs/configure.md "Model rate limits").

:mod:`.bucket` holds the token buckets in Redis, one Lua script per operation
(``lua/``). The layer sits above ``run`` and below the step packages.
"""
