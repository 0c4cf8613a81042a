"""Knowledge bases: create, rename, delete."""

from __future__ import annotations

from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.db.models import RESTRICT, OneToOneRel, ProtectedError, RestrictedError

from core.errors import Conflict, NameTaken
from core.key_limits import resource_create_check
from core.providers.embeddings import EmbeddingConfig
from knowledge.models import FTS_LANGUAGES, KnowledgeBase
from knowledge.services.errors import (
    FILE_CHUNKING,
    MESSAGE_CHUNKING,
    KnowledgeError,
    ReadOnlyKnowledgeBase,
)


def knowledge_base_create(
    *,
    owner: User,
    name: str,
    description: str = "",
    is_memory_base: bool = False,
    source_kind: str = KnowledgeBase.SourceKind.DOCUMENTS,
    language: str = "english",
    chunk_size: int | None = None,
    chunk_overlap: int | None = None,
    embedding: EmbeddingConfig | None = None,
) -> KnowledgeBase:
    """Create a base whose embedding provider, model and dimension are fixed now.

    The configured provider at creation time (or ``embedding``, for a caller with a
    model of its own) is recorded; later searches and ingestion always embed with it. Raises ``NameTaken`` if the owner already has
    a base with this name (the database enforces it).
    """
    longest = KnowledgeBase._meta.get_field("name").max_length or 200
    if not name.strip() or len(name) > longest:  # (the API's serializer says it too)
        said = ("name must not be blank" if not name.strip()
                else f"name must be at most {longest} characters, not {len(name)}")  # fmt: skip
        raise KnowledgeError(said, details={"name": said})
    if source_kind == KnowledgeBase.SourceKind.DOCUMENTS and not is_memory_base:
        resource_create_check("knowledge_bases")  # (a store's or memory base's: their own)
    if language not in FTS_LANGUAGES:
        raise KnowledgeError(f"language must be one of {', '.join(FTS_LANGUAGES)}")
    default_size, default_overlap = (
        FILE_CHUNKING if source_kind == KnowledgeBase.SourceKind.FILES else MESSAGE_CHUNKING
    )
    size = chunk_size or default_size
    overlap = default_overlap if chunk_overlap is None else chunk_overlap
    if overlap >= size:  # the database's check constraint, said as a 400
        given = "" if chunk_overlap is not None else f" (the default, {default_overlap})"
        raise KnowledgeError(
            f"chunk_overlap{given} must be below chunk_size ({size}): give a smaller "
            "chunk_overlap.",
            details={"chunk_overlap": f"Must be below chunk_size ({size})."},
        )
    config = embedding or EmbeddingConfig.from_settings()
    try:
        with transaction.atomic():
            return KnowledgeBase.objects.create(
                owner=owner,
                name=name,
                description=description,
                embedding_provider=config.provider,
                embedding_model=config.model,
                embedding_dimensions=config.dimensions,
                is_memory_base=is_memory_base,
                source_kind=source_kind,
                language=language,
                chunk_size=size,
                chunk_overlap=overlap,
            )
    except IntegrityError as exc:
        if "kb_unique_name_per_owner" in str(exc):
            raise NameTaken(f"a knowledge base named {name!r} already exists") from exc
        raise


def knowledge_base_holder(knowledge_base: KnowledgeBase) -> str | None:
    """What the base belongs to, when it is a memory base's or a memory store's (the
    objects whose one-to-one link keeps it from being deleted alone), by its name: that
    object writes the base's chunks and names it; None for a base of its own."""
    for rel in KnowledgeBase._meta.get_fields(include_hidden=True):
        if not (isinstance(rel, OneToOneRel) and rel.on_delete is RESTRICT):
            continue
        model = rel.related_model
        if model._default_manager.filter(**{rel.field.name: knowledge_base}).exists():
            return str(model._meta.verbose_name)
    return None


def knowledge_base_writable(knowledge_base: KnowledgeBase, *, documents: bool = True) -> None:
    """Raises ``ReadOnlyKnowledgeBase`` (409 ``read_only``) for a base the API does not
    write: one a memory base or a memory store holds (a document there would take a
    captured turn's place, or stand among a store's items), and for ``documents`` one
    that indexes files."""
    if documents and knowledge_base.source_kind == KnowledgeBase.SourceKind.FILES:
        raise ReadOnlyKnowledgeBase("this knowledge base indexes files and is read-only here")
    holder = knowledge_base_holder(knowledge_base)
    if holder is not None:
        raise ReadOnlyKnowledgeBase(
            f"this knowledge base is a {holder}'s: the {holder} writes it (and names it), and "
            "it is read-only here; search it, or write to a knowledge base of your own"
        )


def knowledge_base_update(
    *, knowledge_base: KnowledgeBase, name: str | None = None, description: str | None = None
) -> KnowledgeBase:
    """Rename or re-describe a base (not one a memory base or store holds: 409).
    Embedding settings never change after creation."""
    knowledge_base_writable(knowledge_base, documents=False)
    if name is not None:
        knowledge_base.name = name
    if description is not None:
        knowledge_base.description = description
    try:
        with transaction.atomic():
            knowledge_base.save(update_fields=["name", "description", "updated_at"])
    except IntegrityError as exc:
        raise NameTaken(f"a knowledge base named {name!r} already exists") from exc
    return knowledge_base


def knowledge_base_delete(*, knowledge_base: KnowledgeBase) -> None:
    """Delete a base and all its chunks (one statement, cascaded by the database).

    Raises ``Conflict`` ("in_use", 409) for a base another object depends on (a memory
    base's, a memory store's): those are deleted with their owner object.
    """
    # Chunks have no dependents, so Django deletes them with one DELETE ... WHERE
    # knowledge_base_id = ..., without loading them.
    try:
        with transaction.atomic():
            knowledge_base.delete()
    except (ProtectedError, RestrictedError) as exc:
        objects = (
            exc.protected_objects if isinstance(exc, ProtectedError) else exc.restricted_objects
        )
        users = sorted({f"{type(o)._meta.verbose_name} {o}" for o in objects})
        raise Conflict(
            f"knowledge base {knowledge_base.name!r} belongs to {', '.join(users)}; "
            "delete that instead",
            code="in_use",
        ) from exc
