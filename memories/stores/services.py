"""Writes for memory stores: create, reconfigure, delete, load; delete items."""

from __future__ import annotations

import re
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import dataclass, replace
from typing import Any

from django.contrib.auth.models import User
from django.db import IntegrityError, transaction

from core.errors import Conflict, InvalidInput, NameTaken, NotFound, ServiceError
from core.key_limits import resource_create_check
from memories.stores.backends.base import ReadOnlyStore, StoreBackend
from memories.stores.embedding import EmbeddingSpec, spec_from_block
from memories.stores.models import STORE_NAME_REGEX, MemoryItem, MemoryStore
from memories.stores.registry import StoreType, store_type, store_types


class ConfigInvalid(InvalidInput):
    """A config refused: ``details`` maps each place ("memory[1].config.max_items") to
    its problems; the message names the first."""

    code = "invalid_config"

    def __init__(self, errors: dict[str, list[str]]):
        first, problems = next(iter(errors.items()))
        more = sum(len(v) for v in errors.values()) - 1
        suffix = f" (and {more} more)" if more else ""
        super().__init__(f"{first}: {problems[0]}{suffix}", details=errors)


class UnknownStoreType(Conflict):
    code = "unknown_type"


@dataclass(frozen=True)
class ValidStore:
    """A store definition that passed its type's validation."""

    type: StoreType
    config: dict[str, Any]
    spec: EmbeddingSpec | None  # None: the type does not embed


def validate_store_definition(
    *, name: Any, type_name: Any, config: Any, where: str, errors: dict[str, list[str]]
) -> ValidStore | None:
    """Check a name, a type and a config; problems go to ``errors`` under ``where``."""
    prefix = f"{where}." if where else ""
    if not isinstance(name, str) or not re.fullmatch(STORE_NAME_REGEX, name):
        errors.setdefault(f"{prefix}name", []).append(
            "1-100 letters, digits and . _ -, starting with a letter or digit"
        )
    kind = store_type(type_name) if isinstance(type_name, str) else None
    if kind is None:
        known = ", ".join(t.name for t in store_types())
        errors.setdefault(f"{prefix}type", []).append(
            f"unknown store type {type_name!r} (known: {known})"
        )
        return None
    if config is not None and not isinstance(config, dict):
        errors.setdefault(f"{prefix}config", []).append("must be an object")
        return None
    validated, problems = kind.validate(config)
    for path, messages in problems.items():
        errors.setdefault(f"{prefix}config" + (f".{path}" if path else ""), []).extend(messages)
    if validated is None:
        return None
    spec = spec_from_block(validated.get("embedding")) if kind.embeds else None
    return ValidStore(kind, validated, spec)


def backend_for(store: MemoryStore) -> StoreBackend:
    kind = store_type(store.type)
    if kind is None:
        raise UnknownStoreType(
            f"memory store {store.name!r} has type {store.type!r}, not registered in this process",
            details={"store": store.name, "type": store.type},
        )
    return kind.factory(store, store.config)


def _record(store: MemoryStore, spec: EmbeddingSpec | None) -> None:
    store.embedding_provider = spec.provider if spec else ""
    store.embedding_model = spec.model if spec else ""
    store.embedding_dimensions = spec.dimensions if spec else None


def _spec_of(store: MemoryStore) -> EmbeddingSpec | None:
    if not store.embedding_provider:
        return None
    return EmbeddingSpec(
        store.embedding_provider, store.embedding_model, store.embedding_dimensions
    )


def memory_store_create_valid(*, owner: User, name: str, valid: ValidStore) -> MemoryStore:
    """Create a store from a validated definition (in the caller's transaction)."""
    store = MemoryStore(owner=owner, name=name, type=valid.type.name, config=valid.config)
    _record(store, valid.spec)
    try:
        with transaction.atomic():
            store.save()
            backend_for(store).created()
    except IntegrityError as exc:
        if "memorystore_unique_name" in str(exc):
            raise NameTaken(f"a memory store named {name!r} already exists") from exc
        raise
    return store


def effective_definition(store: MemoryStore, valid: ValidStore) -> ValidStore:
    """A store without an embedding block keeps the default it recorded at creation,
    whatever the service's default is now (as a knowledge base does)."""
    if valid.type.embeds and not valid.config.get("embedding") and not store.has_own_embedding:
        return replace(valid, spec=_spec_of(store))
    return valid


def embedding_change_problem(store: MemoryStore, valid: ValidStore) -> str | None:
    """Why ``valid`` may not replace the store's config, or None."""
    if valid.type.name != store.type:
        return f"store {store.name!r} is a {store.type} store; delete it to change its type"
    valid = effective_definition(store, valid)
    if valid.spec == _spec_of(store):
        return None
    items = MemoryItem.objects.filter(store=store).count()
    if items:
        old = _spec_of(store)
        was = f"{old.provider}/{old.model} ({old.dimensions} dims)" if old else "no embedder"
        return (
            f"store {store.name!r} holds {items} items embedded with {was}; delete its "
            "items (or the store) before changing its embedding"
        )
    return None


def memory_store_update_valid(*, store: MemoryStore, valid: ValidStore) -> MemoryStore:
    """Replace a store's config (same type; a new embedding only while it holds no items
    of its own: a file store re-indexes with the new model)."""
    problem = embedding_change_problem(store, valid)
    valid = effective_definition(store, valid)
    if problem is not None:
        raise Conflict(problem, code="embedding_locked", details={"store": store.name})
    with transaction.atomic():
        store = MemoryStore.objects.select_for_update().get(pk=store.pk)
        changed = valid.spec != _spec_of(store)
        store.config = valid.config
        _record(store, valid.spec)
        store.save()
        if changed:
            backend_for(store).embedding_changed()
    return store


def _validate_or_raise(**kwargs: Any) -> ValidStore:
    errors: dict[str, list[str]] = {}
    valid = validate_store_definition(**kwargs, errors=errors)
    if errors or valid is None:
        raise ConfigInvalid(errors or {kwargs["where"] or "config": ["invalid"]})
    return valid


def _check_loadable(store: MemoryStore, valid: ValidStore) -> None:
    """Raise what loading ``store`` as ``valid`` describes it would raise before writing
    (an unset ``${VAR}``, a dimension mismatch), on an unsaved copy: no network call."""
    candidate = MemoryStore(
        pk=store.pk,
        owner_id=store.owner_id,
        name=store.name,
        type=valid.type.name,
        config=valid.config,
        knowledge_base_id=store.knowledge_base_id,
    )
    _record(candidate, valid.spec)
    backend_for(candidate).check_load()


def memory_store_validate_new(*, owner: User, name: Any, type: Any, config: Any) -> ValidStore:
    """Everything ``memory_store_create`` refuses before it writes: ``ConfigInvalid``
    (400, each bad place named: ``config.max_items``...), ``NameTaken`` (409), and what
    loading the store would refuse (``MissingVariable``, 503). The admin's form shows
    these on the form; the API answers them."""
    valid = _validate_or_raise(name=name, type_name=type, config=config, where="")
    if MemoryStore.objects.filter(owner=owner, name=name).exists():
        raise NameTaken(f"a memory store named {name!r} already exists")
    _check_loadable(MemoryStore(owner=owner, name=name), valid)
    return valid


def memory_store_validate_change(*, store: MemoryStore, config: Any) -> ValidStore:
    """Everything ``memory_store_update`` refuses before it writes: ``ConfigInvalid``
    (400), ``Conflict`` ``embedding_locked`` (409: a new embedding on a store holding
    items), and what loading it would refuse (``MissingVariable``, 503)."""
    valid = _validate_or_raise(name=store.name, type_name=store.type, config=config, where="")
    problem = embedding_change_problem(store, valid)
    if problem is not None:
        raise Conflict(problem, code="embedding_locked", details={"store": store.name})
    _check_loadable(store, effective_definition(store, valid))
    return valid


def memory_store_create(
    *, owner: User, name: str, type: str, config: dict[str, Any] | None, load: bool = True
) -> tuple[MemoryStore, dict[str, Any] | None]:
    """Create a store of a registered type and load it (a file store indexes its files),
    or write nothing: refusals are those of ``memory_store_validate_new``, raised before
    any write; a load that fails anyway (the embedding endpoint down) deletes the store
    again and raises, so the same call can simply be made again. The load runs outside
    any transaction (it embeds); ``load=False`` leaves it to the caller (the admin loads
    once its transaction, attachments included, has committed). Returns the store and
    what loading it did."""
    resource_create_check("memory_stores")
    valid = memory_store_validate_new(owner=owner, name=name, type=type, config=config)
    store = memory_store_create_valid(owner=owner, name=name, valid=valid)
    if not load:
        return store, None
    try:
        return store, memory_store_load(store=store)
    except Exception:
        with suppress(NotFound):  # (deleted meanwhile: the load's own error is the one told)
            memory_store_delete(store=store)
        raise


def memory_store_update(
    *, store: MemoryStore, config: dict[str, Any] | None, load: bool = True
) -> tuple[MemoryStore, dict[str, Any] | None]:
    """Validate and replace the config of a store (see ``memory_store_update_valid``),
    then load it, or change nothing: refusals are those of
    ``memory_store_validate_change``, raised before any write; a load that fails anyway
    puts the previous config and recorded embedding back and raises. (A file store whose
    embedding changed starts its index again either way: the next load fills it.)"""
    valid = memory_store_validate_change(store=store, config=config)
    previous = ValidStore(valid.type, store.config, _spec_of(store))  # the type cannot change
    updated_at = store.updated_at
    store = memory_store_update_valid(store=store, valid=valid)
    if not load:
        return store, None
    try:
        return store, memory_store_load(store=store)
    except Exception:
        _restore(store, previous, updated_at)
        raise


def _restore(store: MemoryStore, previous: ValidStore, updated_at: Any) -> None:
    """The row as it was. Chunks a failed load indexed before it failed are derived data:
    the next load drops those the restored sources do not cover."""
    if previous.spec == _spec_of(store):
        MemoryStore.objects.filter(pk=store.pk).update(
            config=previous.config, updated_at=updated_at
        )
        return
    memory_store_update_valid(store=store, valid=previous)


def memory_store_delete(*, store: MemoryStore) -> None:
    """Delete a store, its items and its attachments (a file store: its knowledge base).
    ``NotFound`` if it is gone already. A write to it either commits first (and its item
    is deleted with the store) or finds it gone (``node_memory_write``: 404)."""
    backend = backend_for(store) if store_type(store.type) else None
    with transaction.atomic():
        # The writers' lock, taken before the items are deleted: else an item a write
        # commits between the items' DELETE and the store's breaks the foreign key.
        if not MemoryStore.objects.select_for_update().filter(pk=store.pk).exists():
            raise NotFound(f"memory store {store.name!r} was deleted")
        store.delete()
        if backend is not None:
            backend.deleted()


def memory_store_problem(*, store: MemoryStore) -> str | None:
    """Why the store cannot answer now (an unset ``${VAR}`` of its embedding block, a
    dimension mismatch), or None: what its node's retrieve and write would report for it
    (no network call)."""
    try:
        backend_for(store).check_load()
    except ServiceError as exc:
        return str(exc)
    return None


def memory_store_load(*, store: MemoryStore) -> dict[str, Any] | None:
    """Bring derived data up to date (a file store re-indexes changed files). Runs
    outside any transaction: it embeds."""
    return backend_for(store).load()


def memory_item_delete(*, store: MemoryStore, item_id: int) -> None:
    """Delete one item of a store (404 if it is not this store's)."""
    if backend_for(store).read_only:
        raise ReadOnlyStore(f"memory store {store.name!r} is read-only")
    deleted, _ = MemoryItem.objects.filter(store=store, pk=item_id).delete()
    if not deleted:
        raise NotFound(f"no item {item_id} in memory store {store.name!r}")


def session_items_delete(*, owner_id: int, session_ids: Sequence[str]) -> int:
    """Delete the items the owner's stores keep of these sessions (written with their
    session ids; an end user's erasure). Returns the items deleted."""
    deleted, _ = MemoryItem.objects.filter(
        store__owner_id=owner_id, session_id__in=list(session_ids)
    ).delete()
    return deleted
