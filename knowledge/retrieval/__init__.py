"""The one retrieval engine: every kind of memory (chunks, facts, store items) is ranked
here, by meaning (``vectors``) and by keyword (``bm25``), fused and decayed (``engine``),
through one database layer (``db``) and one decision of how to walk an index (``hnsw``).
See ``engine`` for the model."""
