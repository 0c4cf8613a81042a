"""What the service remembers, one Django app per kind of memory:
``bases`` (Memory Bases), ``conversations`` (conversation history and node memory),
``facts`` (the facts of every scope: personal and global memories, the engine's core
tier), ``stores`` (memory stores and attachments), ``engine`` (the tiered engine),
``tools`` (the agent tools and MCP), ``proxy`` (the OpenAI-compatible chat proxy)."""
