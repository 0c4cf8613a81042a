"""The tiered memory engine (seed 004): ``MemoryEngine`` in process, ``/api/v1/engine/``
over REST. Its core tier is the personal-memory store generalised to scopes
(``memories.personal.facts``); see ``memories.engine.facade``."""
