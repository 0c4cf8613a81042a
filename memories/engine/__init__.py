"""The tiered memory engine (seed 004): ``MemoryEngine`` in process
(``memories.engine.facade``), ``/api/v1/engine/`` over REST. Its core tier is the
personal-memory store generalised to scopes (``memories.facts.facts`` and
``memories.facts.search``)."""
