"""File sources: index files and directories into a files-backed knowledge base."""

from __future__ import annotations

import codecs
import hashlib
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from django.db.models import Count

from core.providers.embeddings import Embedder
from knowledge.chunking import chunk_text
from knowledge.models import Chunk, KnowledgeBase
from knowledge.services import (
    DocumentIn,
    KnowledgeError,
    knowledge_base_delete_chunks,
    knowledge_base_ingest,
)

KEY_PREFIX = "file:"
SOURCE_TYPE = "file"
# Files are ingested in batches of about this many chunks, so memory stays bounded
# however many files a directory holds (a single bigger file is a batch of its own).
BATCH_CHUNKS = 200
MAX_KEY_LENGTH = Chunk._meta.get_field("document_key").max_length or 512

FileAction = Literal["added", "updated", "unchanged", "deleted", "skipped"]


@dataclass(frozen=True)
class FileEvent:
    """What happened to one file; ``position`` counts from 1 up to ``total`` events."""

    path: Path
    action: FileAction
    chunks: int = 0
    reason: str = ""
    position: int = 0
    total: int = 0


@dataclass
class IndexReport:
    added: int = 0
    updated: int = 0
    unchanged: int = 0
    deleted: int = 0
    skipped: int = 0
    chunks_written: int = 0


@dataclass(frozen=True)
class _Known:
    hashes: frozenset[str]
    chunks: int


@dataclass(frozen=True)
class _Candidate:
    path: Path
    skip_reason: str = ""


# --- finding files ------------------------------------------------------------------
def _normalise_suffixes(suffixes: Sequence[str] | None) -> tuple[str, ...]:
    cleaned = (s.strip().lower() for s in suffixes or ())
    return tuple(s if s.startswith(".") else f".{s}" for s in cleaned if s)


def _resolve_roots(paths: Sequence[Path | str]) -> list[Path]:
    if not paths:
        raise KnowledgeError("no paths to index")
    roots: list[Path] = []
    for raw in paths:
        root = Path(raw).expanduser().resolve()
        if not root.exists():
            raise KnowledgeError(f"path does not exist: {raw}")
        roots.append(root)
    return roots


def _walk(root: Path, *, recursive: bool, suffixes: tuple[str, ...]) -> Iterator[_Candidate]:
    """Files below a directory, sorted; hidden entries are skipped, symlinked dirs too."""
    # os.walk(followlinks=False) lists a symlinked directory but never descends into it.
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if recursive and not d.startswith("."))
        for name in sorted(filenames):
            if name.startswith(".") or (suffixes and not name.lower().endswith(suffixes)):
                continue
            path = Path(dirpath, name)
            reason = "" if path.is_file() else "not a regular file"
            yield _Candidate(path.resolve(), reason)


def _candidates(
    roots: Sequence[Path], *, recursive: bool, suffixes: tuple[str, ...]
) -> list[_Candidate]:
    """Every file to look at, once each, even when roots overlap."""
    found: dict[Path, _Candidate] = {}
    for root in roots:
        if root.is_dir():
            for candidate in _walk(root, recursive=recursive, suffixes=suffixes):
                found.setdefault(candidate.path, candidate)
            continue
        # A file named explicitly shows up in the report even when it is filtered out.
        reason = "" if root.is_file() else "not a regular file"
        if not reason and suffixes and not root.name.lower().endswith(suffixes):
            reason = f"suffix not in {', '.join(suffixes)}"
        found.setdefault(root, _Candidate(root, reason))
    return list(found.values())


def _in_scope(path: Path, roots: Sequence[Path], *, recursive: bool) -> bool:
    for root in roots:
        if path == root:
            return True
        if recursive and path.is_relative_to(root):
            return True
        if not recursive and path.parent == root:
            return True
    return False


def _known_files(kb: KnowledgeBase) -> dict[str, _Known]:
    """Stored content hashes and chunk counts of every indexed file, in one query."""
    rows = (
        Chunk.objects.filter(knowledge_base=kb, source_type=SOURCE_TYPE)
        .values("document_key", "content_hash")
        .annotate(chunks=Count("id"))
        .order_by()
    )
    hashes: dict[str, set[str]] = {}
    counts: dict[str, int] = {}
    for row in rows:
        key = row["document_key"]
        hashes.setdefault(key, set()).add(row["content_hash"])
        counts[key] = counts.get(key, 0) + row["chunks"]
    return {key: _Known(frozenset(hashes[key]), counts[key]) for key in hashes}


def _gone_files(
    known: dict[str, _Known], roots: Sequence[Path], *, recursive: bool
) -> list[tuple[Path, _Known]]:
    """Indexed files under ``roots`` that are no longer there."""
    gone = []
    for key, entry in sorted(known.items()):
        path = Path(key.removeprefix(KEY_PREFIX))
        if key.startswith(KEY_PREFIX) and _in_scope(path, roots, recursive=recursive):
            if not path.is_file():
                gone.append((path, entry))
    return gone


# --- indexing -----------------------------------------------------------------------
@dataclass
class _Indexer:
    """One indexing run: batches documents and reports events in file order."""

    kb: KnowledgeBase
    known: dict[str, _Known]
    encoding: str
    dry_run: bool
    progress: Callable[[FileEvent], None] | None
    total: int
    embedder: Embedder | None = None
    within: tuple[Path, ...] | None = None
    report: IndexReport = field(default_factory=IndexReport)
    position: int = 0
    batch: list[DocumentIn] = field(default_factory=list)
    batch_chunks: int = 0
    # Events wait here until the batch holding their file is committed, so no file
    # is reported as added before it is.
    queued: list[FileEvent] = field(default_factory=list)
    removals: list[FileEvent] = field(default_factory=list)

    def publish(self, event: FileEvent) -> None:
        self.position += 1
        event = FileEvent(
            event.path, event.action, event.chunks, event.reason, self.position, self.total
        )
        setattr(self.report, event.action, getattr(self.report, event.action) + 1)
        if self.progress is not None:
            self.progress(event)

    def emit(self, event: FileEvent) -> None:
        if self.batch:
            self.queued.append(event)
        else:
            self.publish(event)

    def skip(self, path: Path, reason: str) -> None:
        self.emit(FileEvent(path, "skipped", reason=reason))

    def visit(self, candidate: _Candidate) -> None:
        path = candidate.path
        key = f"{KEY_PREFIX}{path}"
        if candidate.skip_reason:
            return self.skip(path, candidate.skip_reason)
        if self.within is not None and not any(path.is_relative_to(r) for r in self.within):
            # A symlink below a root can point anywhere: the resolved path decides.
            return self.skip(path, "outside the allowed directories")
        if len(key) > MAX_KEY_LENGTH:
            return self.skip(path, f"path longer than {MAX_KEY_LENGTH - len(KEY_PREFIX)} chars")
        try:
            data = path.read_bytes()
            mtime = datetime.fromtimestamp(path.stat().st_mtime, tz=UTC)
        except OSError as exc:
            return self.skip(path, f"cannot read: {exc.strerror or exc}")
        digest = hashlib.sha256(data).hexdigest()
        previous = self.known.get(key)
        if previous is not None and previous.hashes == {digest}:
            return self.emit(FileEvent(path, "unchanged", previous.chunks))
        try:
            text = data.decode(self.encoding).removeprefix("\ufeff")
        except UnicodeDecodeError as exc:
            return self.skip(path, f"not valid {self.encoding} at byte {exc.start}: {exc.reason}")
        if "\x00" in text:
            # PostgreSQL text cannot hold NUL; such a file is binary anyway.
            return self.skip(path, "contains NUL characters (binary file?)")
        pieces = len(chunk_text(text, size=self.kb.chunk_size, overlap=self.kb.chunk_overlap))
        if pieces == 0:
            if previous is None:
                return self.skip(path, "file is empty")
            return self.remove(path, previous, "file is empty")
        document = DocumentIn(
            text=text,
            source_key=key,
            source_type=SOURCE_TYPE,
            file_path=str(path),
            content_hash=digest,
            timestamp=mtime,
        )
        action: FileAction = "added" if previous is None else "updated"
        self.add(document, pieces)
        self.emit(FileEvent(path, action, pieces))
        if self.batch_chunks >= BATCH_CHUNKS:
            self.flush()

    def add(self, document: DocumentIn, pieces: int) -> None:
        if self.dry_run:
            self.report.chunks_written += pieces
            return
        self.batch.append(document)
        self.batch_chunks += pieces

    def remove(self, path: Path, previous: _Known, reason: str) -> None:
        self.removals.append(FileEvent(path, "deleted", previous.chunks, reason))

    def flush(self) -> None:
        if self.batch:
            result = knowledge_base_ingest(
                knowledge_base=self.kb, documents=self.batch, embedder=self.embedder
            )
            self.report.chunks_written += result.chunks_written
        self.batch, self.batch_chunks = [], 0
        queued, self.queued = self.queued, []
        for event in queued:
            self.publish(event)

    def delete_removed(self) -> None:
        keys = [f"{KEY_PREFIX}{event.path}" for event in self.removals]
        if keys and not self.dry_run:
            knowledge_base_delete_chunks(knowledge_base=self.kb, document_keys=keys)
        for event in self.removals:
            self.publish(event)


def knowledge_base_index_files(
    *,
    knowledge_base: KnowledgeBase,
    paths: Sequence[Path],
    suffixes: Sequence[str] | None = None,
    recursive: bool = True,
    encoding: str = "utf-8",
    dry_run: bool = False,
    progress: Callable[[FileEvent], None] | None = None,
    embedder: Embedder | None = None,
    within: Sequence[Path] | None = None,
) -> IndexReport:
    """Bring a files-backed base in line with the files under ``paths``.

    Each path is a file or a directory, walked recursively unless ``recursive`` is
    false; hidden entries and symlinked directories below a root are skipped, and
    ``suffixes`` (e.g. ``[".md", ".txt"]``) filters by file name. A file is one
    document keyed ``file:<resolved path>`` whose chunks carry ``source_type="file"``,
    ``file_path``, ``content_hash`` (sha256 of the bytes) and the mtime as timestamp.
    Files whose hash is already stored are left alone (no embedding, no write); new
    and changed ones are ingested in batches of about ``BATCH_CHUNKS`` chunks, each
    batch committed on its own. Files indexed before under these roots that no longer
    exist, or are now empty, lose their chunks; files elsewhere are never touched.
    A file that cannot be read or decoded is reported as ``skipped`` with a reason
    and keeps whatever chunks it had. ``dry_run`` computes the same report
    (``chunks_written`` counting chunks that would be written) without embedding or
    writing. ``progress`` receives one ``FileEvent`` per file. ``embedder`` replaces
    the base's own (see ``knowledge_base_ingest``). ``within``: files whose resolved
    path (symlinks followed) lies outside these directories are skipped. Raises
    ``KnowledgeError`` for a base that is not files-backed, a path that does not
    exist, or an unknown encoding.
    """
    if knowledge_base.source_kind != KnowledgeBase.SourceKind.FILES:
        raise KnowledgeError(
            f"knowledge base {knowledge_base.name!r} is not file-backed "
            f"(source_kind={knowledge_base.source_kind})"
        )
    try:
        codecs.lookup(encoding)
    except LookupError:
        raise KnowledgeError(f"unknown encoding {encoding!r}") from None
    roots = _resolve_roots(paths)
    candidates = _candidates(roots, recursive=recursive, suffixes=_normalise_suffixes(suffixes))
    known = _known_files(knowledge_base)
    gone = _gone_files(known, roots, recursive=recursive)
    indexer = _Indexer(
        kb=knowledge_base,
        known=known,
        encoding=encoding,
        dry_run=dry_run,
        progress=progress,
        total=len(candidates) + len(gone),
        embedder=embedder,
        within=None if within is None else tuple(Path(p).resolve() for p in within),
    )
    for candidate in candidates:
        indexer.visit(candidate)
    indexer.flush()
    for path, entry in gone:
        indexer.remove(path, entry, "file no longer exists")
    indexer.delete_removed()
    return indexer.report
