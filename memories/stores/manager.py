"""The in-process API for Python callers: DevAll's MemoryManager, on this service.

```python
manager = MemoryManager.for_node(owner=user, flow=flow, node_id="answer")
manager.load()                                   # file stores re-index changed files
memories = manager.retrieve(stage="gen", query="How do I deploy?")
prompt = memories.prompt                         # the "Related Memories" block
manager.update(input="How do I deploy?", output=answer)   # {store: WriteResult}
manager.save()                                   # no-op: updates are committed
```

It runs the same services as the HTTP calls; each store keeps its own ranking (no
re-scoring by recency or length across stores).
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import User

from memories.conversations.models import Flow
from memories.conversations.selectors import flow_get
from memories.stores.backends.base import WriteResult
from memories.stores.models import MemoryAttachment
from memories.stores.runtime import (
    Retrieval,
    attachments_or_404,
    node_memory_retrieve,
    node_memory_write,
)
from memories.stores.services import backend_for


class MemoryManager:
    def __init__(self, *, flow: Flow, node_id: str):
        self.flow = flow
        self.node_id = node_id
        self.attachments: list[MemoryAttachment] = attachments_or_404(flow, node_id)

    @classmethod
    def for_node(cls, *, owner: User, flow: Flow | str, node_id: str) -> MemoryManager:
        """``flow`` is a Flow or the id of one of ``owner``'s flows (404 otherwise)."""
        if not isinstance(flow, Flow) or flow.owner_id != owner.pk:
            flow = flow_get(owner=owner, flow_id=flow.pk if isinstance(flow, Flow) else flow)
        return cls(flow=flow, node_id=node_id)

    def _stores(self) -> list[Any]:
        seen, out = set(), []
        for attachment in self.attachments:
            if attachment.store_id not in seen:
                seen.add(attachment.store_id)
                out.append(attachment.store)
        return out

    def load(self) -> dict[str, Any]:
        """Load every attached store; the reports of those that had work to do."""
        reports = {}
        for store in self._stores():
            report = backend_for(store).load()
            if report is not None:
                reports[store.name] = report
        return reports

    def retrieve(
        self, *, stage: str, query: str, session_id: str = "", max_tokens: int | None = None
    ) -> Retrieval:
        return node_memory_retrieve(
            flow=self.flow,
            node_id=self.node_id,
            stage=stage,
            query=query,
            session_id=session_id,
            max_tokens=max_tokens,
            attachments=self.attachments,
        )

    def update(
        self,
        *,
        input: Any,
        output: Any,
        metadata: dict[str, Any] | None = None,
        session_id: str = "",
    ) -> dict[str, WriteResult]:
        results = node_memory_write(
            flow=self.flow,
            node_id=self.node_id,
            input=input,
            output=output,
            metadata=metadata,
            session_id=session_id,
            attachments=self.attachments,
        )
        return {r.store: r.result for r in results}

    def save(self) -> None:
        for store in self._stores():
            backend_for(store).save()
