"""The tiered memory engine (seed 004): ``MemoryEngine`` in process
(``memories.engine.facade``), ``/api/v1/engine/`` over REST. Its core tier is the
facts room (``memories.facts``: its write service, its search, its injection)."""
