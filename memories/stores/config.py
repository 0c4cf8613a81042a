"""Declarative configuration: an owner's stores and node attachments in one document.

```yaml
memory:  [{name, type, config}]
nodes:   [{id, flow, memories: [{name, retrieve_stage, top_k, similarity_threshold,
                                 read, write}]}]
```

Applying is all or nothing and idempotent: every problem is reported at its place
(``memory[1].config.max_items``, ``nodes[0].memories[2].write``) and nothing is
written; the same document twice changes nothing. Stores named in the document are
created or reconfigured, other stores are left alone; a node listed gets exactly the
attachments listed. The export has the same shape, so export then import is a no-op.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from django.contrib.auth.models import User
from django.db import transaction
from rest_framework import serializers

from core.api.fields import (
    StrictBooleanField,
    StrictCharField,
    StrictFloatField,
    StrictIntegerField,
)
from core.db import advisory_xact_lock
from core.errors import ServiceError
from core.validation import NODE_ID
from memories.conversations.models import Flow
from memories.conversations.selectors import flow_list
from memories.stores.models import STAGES, MemoryAttachment, MemoryStore
from memories.stores.registry import StrictConfig, flatten_errors, store_type
from memories.stores.selectors import memory_stores_by_name, owner_attachments
from memories.stores.services import (
    ConfigInvalid,
    ValidStore,
    backend_for,
    effective_definition,
    embedding_change_problem,
    memory_store_create_valid,
    memory_store_update_valid,
    validate_store_definition,
)

logger = logging.getLogger(__name__)
Action = Literal["create", "update", "delete", "unchanged"]
TOP_KEYS = ("memory", "nodes")


class AttachmentConfig(StrictConfig):
    name = StrictCharField(max_length=100)
    retrieve_stage = serializers.ListField(
        child=serializers.ChoiceField(STAGES), required=False, default=list
    )
    top_k = StrictIntegerField(min_value=1, max_value=100, default=3)
    similarity_threshold = StrictFloatField(min_value=-1.0, max_value=1.0, default=-1.0)
    read = StrictBooleanField(default=True)
    write = StrictBooleanField(default=True)

    def validate_retrieve_stage(self, value: list[str]) -> list[str]:
        return list(dict.fromkeys(value))


def attachment_validate(
    raw: Any, *, where: str, errors: dict[str, list[str]]
) -> dict[str, Any] | None:
    """An attachment's fields (``AttachmentConfig``: stages, ``top_k``, threshold, read,
    write, with their defaults), or None with its problems in ``errors`` under
    ``where``. The config document and the admin's attachment rows both check here."""
    data = AttachmentConfig(data=raw)
    if not data.is_valid():
        for path, messages in flatten_errors(data.errors, where).items():
            errors.setdefault(path, []).extend(messages)
        return None
    return dict(data.validated_data)


def attachment_write_check(
    attachment: dict[str, Any], *, read_only: bool, where: str, errors: dict[str, list[str]]
) -> None:
    """A write attachment on a read-only store (a ``file`` store) is refused."""
    if read_only and attachment["write"]:
        name = attachment["name"]
        _error(errors, f"{where}.write", f"store {name!r} is read-only: set write: false")


def attached_twice(name: str) -> str:
    return f"store {name!r} is attached twice to this node"


@dataclass(frozen=True)
class Change:
    kind: Literal["store", "attachment"]
    action: Action
    store: str
    flow: str = ""
    node: str = ""


@dataclass
class ConfigResult:
    dry_run: bool
    changes: list[Change]
    loads: dict[str, Any] = field(default_factory=dict)

    @property
    def changed(self) -> bool:
        return any(c.action != "unchanged" for c in self.changes)

    def as_dict(self) -> dict[str, Any]:
        return {
            "dry_run": self.dry_run,
            "changed": self.changed,
            "changes": [asdict(c) for c in self.changes],
            "loads": self.loads,
        }


@dataclass
class _Node:
    flow: Flow
    node_id: str
    attachments: list[dict[str, Any]]  # validated AttachmentConfig data, in order


@dataclass
class _Plan:
    stores: list[tuple[str, ValidStore, MemoryStore | None]]
    nodes: list[_Node]


def _error(errors: dict[str, list[str]], where: str, message: str) -> None:
    errors.setdefault(where, []).append(message)


def _unknown_keys(
    entry: dict[str, Any], allowed: tuple[str, ...], where: str, errors: dict
) -> None:
    for key in entry:
        if key not in allowed:
            _error(errors, f"{where}.{key}" if where else str(key), "unknown field")


def _list(doc: dict[str, Any], key: str, errors: dict[str, list[str]]) -> list[Any]:
    value = doc.get(key) or []
    if not isinstance(value, list):
        _error(errors, key, "must be a list")
        return []
    return value


def _flows(owner: User) -> dict[str, Flow]:
    by_ref: dict[str, Flow] = {}
    for flow in flow_list(owner=owner):
        by_ref[flow.name] = flow
        by_ref[str(flow.pk)] = flow
    return by_ref


def _check_stores(
    entries: list[Any], existing: dict[str, MemoryStore], errors: dict[str, list[str]]
) -> dict[str, tuple[int, ValidStore | None]]:
    defined: dict[str, tuple[int, ValidStore | None]] = {}
    for index, entry in enumerate(entries):
        where = f"memory[{index}]"
        if not isinstance(entry, dict):
            _error(errors, where, "must be an object with name, type and config")
            continue
        _unknown_keys(entry, ("name", "type", "config"), where, errors)
        name = entry.get("name")
        first = defined[name][0] if isinstance(name, str) and name in defined else None
        if first is not None:
            _error(errors, f"{where}.name", f"duplicate store name {name!r} (memory[{first}])")
        valid = validate_store_definition(  # a duplicate's type and config are checked too
            name=name,
            type_name=entry.get("type"),
            config=entry.get("config"),
            where=where,
            errors=errors,
        )
        if first is not None:
            continue
        if isinstance(name, str):
            defined[name] = (index, valid)
        if valid is not None and isinstance(name, str) and name in existing:
            problem = embedding_change_problem(existing[name], valid)
            if problem is not None:
                place = "type" if valid.type.name != existing[name].type else "config.embedding"
                _error(errors, f"{where}.{place}", problem)
    return defined


def _store_kind(
    name: str, defined: dict[str, tuple[int, ValidStore | None]], existing: dict[str, MemoryStore]
) -> tuple[bool, bool]:
    """(known, read-only) for a store named by an attachment."""
    if name in defined:
        valid = defined[name][1]
        return True, bool(valid and valid.type.read_only)
    if name in existing:
        kind = store_type(existing[name].type)
        return True, bool(kind and kind.read_only)
    return False, False


def _check_node(
    index: int,
    entry: Any,
    flows: dict[str, Flow],
    stores: tuple[dict[str, tuple[int, ValidStore | None]], dict[str, MemoryStore]],
    errors: dict[str, list[str]],
) -> _Node | None:
    where = f"nodes[{index}]"
    if not isinstance(entry, dict):
        _error(errors, where, "must be an object with id, flow and memories")
        return None
    _unknown_keys(entry, ("id", "flow", "memories"), where, errors)
    node_id, flow_ref = entry.get("id"), entry.get("flow")
    if not NODE_ID.matches(node_id):
        _error(errors, f"{where}.id", NODE_ID.message)
    flow = flows.get(str(flow_ref)) if isinstance(flow_ref, str | uuid.UUID) else None
    if flow is None:
        _error(errors, f"{where}.flow", f"no flow {flow_ref!r} of yours (an id or a name)")
    memories = entry.get("memories") or []
    if not isinstance(memories, list):
        _error(errors, f"{where}.memories", "must be a list")
        return None
    attachments, seen = [], set()
    for j, raw in enumerate(memories):
        place = f"{where}.memories[{j}]"
        attachment = attachment_validate(raw, where=place, errors=errors)
        # An attachment with a bad stage or top_k still has its store named, or refused.
        if attachment is not None:
            name = attachment["name"]
        else:
            name = raw.get("name") if isinstance(raw, dict) else None
        if not isinstance(name, str) or f"{place}.name" in errors:
            continue
        known, read_only = _store_kind(name, *stores)
        if not known:
            _error(errors, f"{place}.name", f"no memory store named {name!r}")
        elif name in seen:
            _error(errors, f"{place}.name", attached_twice(name))
        elif attachment is not None:
            attachment_write_check(attachment, read_only=read_only, where=place, errors=errors)
        seen.add(name)
        if attachment is not None:
            attachments.append(attachment)
    if flow is None or not NODE_ID.matches(node_id):
        return None
    return _Node(flow=flow, node_id=str(node_id), attachments=attachments)


def _validate(owner: User, document: Any) -> _Plan:
    errors: dict[str, list[str]] = {}
    if not isinstance(document, dict):
        raise ConfigInvalid({"(document)": ["must be a mapping with memory and nodes"]})
    _unknown_keys(document, TOP_KEYS, "", errors)
    existing = memory_stores_by_name(owner=owner)
    defined = _check_stores(_list(document, "memory", errors), existing, errors)
    flows = _flows(owner)
    nodes: list[_Node] = []
    seen: dict[tuple[Any, str], int] = {}
    for index, entry in enumerate(_list(document, "nodes", errors)):
        node = _check_node(index, entry, flows, (defined, existing), errors)
        if node is None:
            continue
        key = (node.flow.pk, node.node_id)
        if key in seen:
            _error(errors, f"nodes[{index}].id", f"node listed twice (nodes[{seen[key]}])")
        seen[key] = index
        nodes.append(node)
    if errors:
        raise ConfigInvalid(errors)
    stores = [
        (name, valid, existing.get(name))
        for name, (_, valid) in defined.items()
        if valid is not None
    ]
    return _Plan(stores=stores, nodes=nodes)


_FIELDS = ("retrieve_stage", "top_k", "similarity_threshold", "read", "write")


def _attachment_values(attachment: MemoryAttachment) -> dict[str, Any]:
    return {"name": attachment.store.name, **{f: getattr(attachment, f) for f in _FIELDS}}


def _store_action(valid: ValidStore, current: MemoryStore | None) -> Action:
    if current is None:
        return "create"
    target = effective_definition(current, valid)
    same_spec = target.spec is None or (
        (target.spec.provider, target.spec.model, target.spec.dimensions)
        == (current.embedding_provider, current.embedding_model, current.embedding_dimensions)
    )
    return "unchanged" if current.config == valid.config and same_spec else "update"


def _node_changes(node: _Node) -> tuple[list[Change], list[MemoryAttachment]]:
    current = {
        a.store.name: a
        for a in MemoryAttachment.objects.filter(flow=node.flow, node_id=node.node_id)
        .select_related("store")
        .order_by("position", "id")
    }
    order = list(current)
    wanted = [a["name"] for a in node.attachments]
    changes = []
    for position, attachment in enumerate(node.attachments):
        name = attachment["name"]
        old = current.get(name)
        if old is None:
            action: Action = "create"
        elif _attachment_values(old) != attachment or order.index(name) != position:
            action = "update"
        else:
            action = "unchanged"
        changes.append(Change("attachment", action, name, node.flow.name, node.node_id))
    gone = [a for name, a in current.items() if name not in wanted]
    changes += [
        Change("attachment", "delete", a.store.name, node.flow.name, node.node_id) for a in gone
    ]
    return changes, gone


def _apply_node(owner: User, node: _Node, gone: list[MemoryAttachment]) -> None:
    MemoryAttachment.objects.filter(pk__in=[a.pk for a in gone]).delete()
    stores = memory_stores_by_name(owner=owner)
    for position, attachment in enumerate(node.attachments):
        values = {f: attachment[f] for f in _FIELDS}
        MemoryAttachment.objects.update_or_create(
            flow=node.flow,
            node_id=node.node_id,
            store=stores[attachment["name"]],
            defaults={**values, "position": position},
        )


def _load(stores: list[MemoryStore]) -> dict[str, Any]:
    """Load stores created or changed (a file store indexes its files) after the commit;
    a failure is reported per store, the config stays applied."""
    out: dict[str, Any] = {}
    for store in stores:
        try:
            backend = backend_for(store)
            backend.check_load()  # (a store with nothing to load has its ${VAR}s too)
            report = backend.load()
        except ServiceError as exc:
            logger.warning("memory store %s: load failed: %s", store.name, exc)
            out[store.name] = {"error": {"code": exc.code, "message": str(exc)}}
            continue
        if report is not None:
            out[store.name] = report
    return out


def memory_config_apply(
    *, owner: User, document: Any, dry_run: bool = False, load: bool = True
) -> ConfigResult:
    """Apply (or, with ``dry_run``, only plan) a configuration document for ``owner``.

    Raises ``ConfigInvalid`` (400) listing every problem by its place, with nothing
    written. Applies run one at a time per owner (an advisory lock), inside one
    transaction. After the commit, stores created or changed are loaded (a file store
    indexes its files) unless ``load`` is false; ``loads`` reports each.
    """
    with transaction.atomic():
        advisory_xact_lock(f"memory-config:{owner.pk}")
        plan = _validate(owner, document)
        changes: list[Change] = []
        to_load: list[MemoryStore] = []
        for name, valid, current in plan.stores:
            action = _store_action(valid, current)
            changes.append(Change("store", action, name))
            if dry_run or action == "unchanged":
                continue
            if current is None:
                to_load.append(memory_store_create_valid(owner=owner, name=name, valid=valid))
            else:
                to_load.append(memory_store_update_valid(store=current, valid=valid))
        for node in plan.nodes:
            node_changes, gone = _node_changes(node)
            changes += node_changes
            if not dry_run and any(c.action != "unchanged" for c in node_changes):
                _apply_node(owner, node, gone)
    result = ConfigResult(dry_run=dry_run, changes=changes)
    if load and not dry_run:
        result.loads = _load(to_load)
    return result


def memory_config_export(*, owner: User) -> dict[str, Any]:
    """The owner's stores and attachments in the shape ``memory_config_apply`` takes."""
    stores = sorted(memory_stores_by_name(owner=owner).values(), key=lambda s: s.name)
    ids = {str(flow.pk) for flow in flow_list(owner=owner)}
    nodes: dict[tuple[Any, str], dict[str, Any]] = {}
    for attachment in owner_attachments(owner=owner):
        key = (attachment.flow_id, attachment.node_id)
        # A flow is named by its name, unless that name is another flow's id (an apply
        # reads a reference as an id first): then by its own id.
        name = attachment.flow.name
        flow_ref = (
            str(attachment.flow_id) if name in ids and name != str(attachment.flow_id) else name
        )
        node = nodes.setdefault(key, {"id": attachment.node_id, "flow": flow_ref, "memories": []})
        node["memories"].append(_attachment_values(attachment))
    return {
        "memory": [{"name": s.name, "type": s.type, "config": s.config} for s in stores],
        "nodes": list(nodes.values()),
    }
