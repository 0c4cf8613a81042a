"""What the service remembers, one Django app per kind of memory:
``bases`` (Memory Bases), ``conversations`` (conversation history and node memory),
``personal`` (personal memories and the chat proxy)."""
