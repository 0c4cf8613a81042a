"""Node memory: a per-(flow, conversation, node) history kept as a JSON document.

Storage: ``node_memory/{flow_id}/{conversation}/{node_id}.json`` through the Django
storage ``settings.NODE_MEMORY_STORAGE`` (local files by default, any object store
through its storage backend); no table holds the messages. ``{conversation}`` is the
session id itself when it is made of letters, digits and ``. _ -`` only (at most 200
characters), else ``~`` + its SHA-256, so no session id can name another's path.
A document larger than ``NODE_MEMORY_GZIP_BYTES`` (when > 0) is stored gzipped as
``.json.gz``; reads take whichever exists (the higher ``revision`` if both do, after
a crash between writing one and deleting the other).

Document: ``{"version": 1, "revision", "owner_id", "flow_id", "session_id",
"node_id", "created_at", "updated_at", "messages": [...]}``; each message has
``message_id``, ``parent_message_id``, ``role``, ``content``, ``files``,
``token_count`` (tokens of the content) and ``created_at``.

Turns: a turn is the seed's ``add_messages`` call, one user and one assistant
message stored under the same ``message_id`` (the caller's message id, e.g. of the
Message table) and the same ``parent_message_id`` (the turn it follows). A null
parent starts a thread (the first turn, or a regeneration of it); an omitted parent
(``LATEST``) is resolved when writing to the newest turn, so callers that do not
track parents get a linear history. A parent must already be in the document and
a message id may not be reused, so the turns always form a forest: no cycles.

Concurrency: every write is a read-modify-write under a Postgres advisory lock
keyed by the document path (``pg_advisory_xact_lock``), so two executions of the
same node never lose a turn. Local files are replaced atomically (temp file +
rename), so readers need no lock; with other storages readers take the lock shared.
Each process keeps the last parsed documents (up to ``CACHE_MAX_BYTES`` of JSON),
checked against the bytes read on every access, so a read skips the parse when the
document has not changed, whoever wrote it.
"""

from __future__ import annotations

from memories.conversations.node_memory.buffer import (
    MemoryConfig,
    MemoryMode,
    NodeTokenBufferMemory,
    memory_for,
)
from memories.conversations.node_memory.services import (
    node_memory_append_turn,
    node_memory_append_turns,
    node_memory_clear,
    node_memory_delete_idle,
    node_memory_history,
)
from memories.conversations.node_memory.values import (
    LATEST,
    MESSAGE_ID_MAX,
    DuplicateMessage,
    MemoryConfigurationError,
    NodeKey,
    NodeMemoryNotFound,
    NodeTurn,
    TurnIn,
    UnknownParent,
    node_key,
    session_segment,
)

__all__ = [
    "DuplicateMessage",
    "LATEST",
    "MESSAGE_ID_MAX",
    "MemoryConfigurationError",
    "NodeKey",
    "NodeMemoryNotFound",
    "NodeTurn",
    "TurnIn",
    "UnknownParent",
    "node_key",
    "session_segment",
    "node_memory_append_turn",
    "node_memory_append_turns",
    "node_memory_clear",
    "node_memory_delete_idle",
    "node_memory_history",
    "MemoryConfig",
    "MemoryMode",
    "NodeTokenBufferMemory",
    "memory_for",
]
