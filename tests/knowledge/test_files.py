"""File sources: indexing, change detection, deletions, the command and read-only API."""

from __future__ import annotations

import hashlib
import os
from datetime import UTC, datetime
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from knowledge import services
from knowledge.files import FileEvent, IndexReport, knowledge_base_index_files
from knowledge.models import Chunk, KnowledgeBase
from knowledge.services import KnowledgeError
from knowledge.services import ingest as ingest_module
from tests.knowledge.factories import make_kb

pytestmark = pytest.mark.django_db

LONG = " ".join(f"alpha{i}" for i in range(120))  # 969 characters -> 3 chunks at 500/50
SHORT = " ".join(f"beta{i}" for i in range(40))  # 269 characters -> 1 chunk
OLD = datetime(2020, 1, 1, tzinfo=UTC)


def _write(path: Path, content: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return path


def _key(path: Path) -> str:
    return f"file:{path.resolve()}"


def _files_kb(owner, name: str = "docs") -> KnowledgeBase:
    return make_kb(owner, name=name, source_kind="files")


def _index(kb: KnowledgeBase, *paths: Path, **kwargs) -> tuple[IndexReport, list[FileEvent]]:
    events: list[FileEvent] = []
    report = knowledge_base_index_files(
        knowledge_base=kb, paths=list(paths), progress=events.append, **kwargs
    )
    return report, events


def _counts(kb: KnowledgeBase) -> dict[str, int]:
    counts: dict[str, int] = {}
    for key in Chunk.objects.filter(knowledge_base=kb).values_list("document_key", flat=True):
        counts[key] = counts.get(key, 0) + 1
    return counts


def _snapshot(kb: KnowledgeBase) -> list[tuple]:
    return list(
        Chunk.objects.filter(knowledge_base=kb)
        .order_by("source_key")
        .values_list("id", "source_key", "text", "updated_at")
    )


def _report(**counts: int) -> IndexReport:
    return IndexReport(**counts)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path.resolve() / "notes"
    _write(root / "a.md", LONG)
    _write(root / "b.txt", SHORT)
    _write(root / "sub" / "c.md", SHORT)
    return root


@pytest.fixture
def no_embedding(monkeypatch):
    """Fail the test if anything is embedded."""

    def refuse(kb):
        raise AssertionError("nothing should be embedded")

    monkeypatch.setattr(ingest_module, "kb_embedder", refuse)


# --- first index ---------------------------------------------------------------------
def test_first_index_adds_every_file_with_metadata(alice, tree):
    kb = _files_kb(alice)
    report, events = _index(kb, tree)
    assert report == _report(added=3, chunks_written=5)
    assert [(e.path, e.action, e.chunks, e.position, e.total) for e in events] == [
        (tree / "a.md", "added", 3, 1, 3),
        (tree / "b.txt", "added", 1, 2, 3),
        (tree / "sub" / "c.md", "added", 1, 3, 3),
    ]
    assert _counts(kb) == {
        _key(tree / "a.md"): 3,
        _key(tree / "b.txt"): 1,
        _key(tree / "sub" / "c.md"): 1,
    }
    a_path = tree / "a.md"
    chunks = list(Chunk.objects.filter(document_key=_key(a_path)).order_by("chunk_index"))
    expected_hash = hashlib.sha256(LONG.encode()).hexdigest()
    expected_time = datetime.fromtimestamp(a_path.stat().st_mtime, tz=UTC)
    assert [c.source_key for c in chunks] == [f"{_key(a_path)}#{i}" for i in range(3)]
    for chunk in chunks:
        assert (chunk.source_type, chunk.file_path, chunk.content_hash) == (
            "file",
            str(a_path.resolve()),
            expected_hash,
        )
        assert chunk.source_timestamp == expected_time
        assert chunk.chunk_total == 3
        assert chunk.metadata == {}
        assert len(chunk.text) <= 500
    kb.refresh_from_db()
    texts = list(Chunk.objects.filter(knowledge_base=kb).values_list("text", flat=True))
    assert kb.chunk_count == 5
    assert kb.char_count == sum(len(t) for t in texts)
    assert kb.word_count == sum(len(t.split()) for t in texts)
    assert kb.source_types == ["file"]


def test_reindex_with_nothing_changed_writes_nothing(
    alice, tree, django_assert_num_queries, monkeypatch
):
    kb = _files_kb(alice)
    _index(kb, tree)
    Chunk.objects.filter(knowledge_base=kb).update(updated_at=OLD)
    before = _snapshot(kb)
    kb.refresh_from_db()
    counters = (kb.chunk_count, kb.word_count, kb.char_count, kb.size_bytes)
    monkeypatch.setattr(ingest_module, "kb_embedder", lambda kb: pytest.fail("embedded"))
    with django_assert_num_queries(1):  # the stored hashes, nothing else
        report, events = _index(kb, tree)
    assert report == _report(unchanged=3)
    assert [(e.action, e.chunks) for e in events] == [
        ("unchanged", 3),
        ("unchanged", 1),
        ("unchanged", 1),
    ]
    assert _snapshot(kb) == before
    assert all(row[3] == OLD for row in before)
    kb.refresh_from_db()
    assert (kb.chunk_count, kb.word_count, kb.char_count, kb.size_bytes) == counters


def test_changing_one_file_reingests_only_it(alice, tree):
    kb = _files_kb(alice)
    _index(kb, tree)
    Chunk.objects.filter(knowledge_base=kb).update(updated_at=OLD)
    others = [r for r in _snapshot(kb) if not r[1].startswith(_key(tree / "a.md"))]
    _write(tree / "a.md", "a much shorter text now")
    report, events = _index(kb, tree)
    assert report == _report(updated=1, unchanged=2, chunks_written=1)
    assert [(e.path.name, e.action) for e in events] == [
        ("a.md", "updated"),
        ("b.txt", "unchanged"),
        ("c.md", "unchanged"),
    ]
    after = _snapshot(kb)
    assert [r for r in after if not r[1].startswith(_key(tree / "a.md"))] == others
    changed = Chunk.objects.get(document_key=_key(tree / "a.md"))
    assert changed.text == "a much shorter text now"
    assert changed.updated_at > OLD
    assert changed.content_hash == hashlib.sha256(b"a much shorter text now").hexdigest()
    kb.refresh_from_db()
    assert kb.chunk_count == 3


def test_deleting_a_file_removes_exactly_its_chunks(alice, tree):
    kb = _files_kb(alice)
    _index(kb, tree)
    kept = [r for r in _snapshot(kb) if not r[1].startswith(_key(tree / "a.md"))]
    (tree / "a.md").unlink()
    report, events = _index(kb, tree)
    assert report == _report(unchanged=2, deleted=1)
    assert (events[-1].path, events[-1].action, events[-1].chunks, events[-1].reason) == (
        (tree / "a.md").resolve(),
        "deleted",
        3,
        "file no longer exists",
    )
    assert [e.position for e in events] == [1, 2, 3]
    assert _snapshot(kb) == kept
    kb.refresh_from_db()
    texts = [r[2] for r in kept]
    assert (kb.chunk_count, kb.char_count, kb.word_count, kb.size_bytes) == (
        2,
        sum(len(t) for t in texts),
        sum(len(t.split()) for t in texts),
        sum(len(t.encode()) for t in texts),
    )


def test_emptied_file_loses_its_chunks_and_new_empty_file_is_skipped(alice, tree):
    kb = _files_kb(alice)
    _index(kb, tree)
    _write(tree / "a.md", "  \n")
    _write(tree / "new.md", "")
    report, events = _index(kb, tree)
    assert report == _report(unchanged=2, deleted=1, skipped=1)
    assert [(e.path.name, e.action, e.reason) for e in events] == [
        ("b.txt", "unchanged", ""),
        ("new.md", "skipped", "file is empty"),
        ("c.md", "unchanged", ""),
        ("a.md", "deleted", "file is empty"),
    ]
    assert _key(tree / "a.md") not in _counts(kb)
    kb.refresh_from_db()
    assert kb.chunk_count == 2


# --- selection -----------------------------------------------------------------------
def test_suffix_filter_and_hidden_directories(alice, tree):
    _write(tree / ".git" / "HEAD.md", "hidden directory")
    _write(tree / ".hidden.md", "hidden file")
    kb = _files_kb(alice)
    report, _ = _index(kb, tree, suffixes=["md"])
    assert report == _report(added=2, chunks_written=4)
    assert sorted(_counts(kb)) == sorted([_key(tree / "a.md"), _key(tree / "sub" / "c.md")])


def test_explicit_file_outside_the_filter_is_reported_skipped(alice, tree):
    kb = _files_kb(alice)
    report, events = _index(kb, tree / "b.txt", suffixes=[".md"])
    assert report == _report(skipped=1)
    assert events[0].reason == "suffix not in .md"
    assert _counts(kb) == {}


def test_non_recursive_indexes_top_level_only(alice, tree):
    kb = _files_kb(alice)
    report, _ = _index(kb, tree, recursive=False)
    assert report == _report(added=2, chunks_written=4)
    assert sorted(_counts(kb)) == sorted([_key(tree / "a.md"), _key(tree / "b.txt")])


def test_non_recursive_run_leaves_subdirectory_chunks_alone(alice, tree):
    kb = _files_kb(alice)
    _index(kb, tree)
    (tree / "sub" / "c.md").unlink()
    report, _ = _index(kb, tree, recursive=False)
    assert report == _report(unchanged=2)
    assert _key(tree / "sub" / "c.md") in _counts(kb)


def test_symlinked_directory_is_not_followed(alice, tree, tmp_path):
    outside = _write(tmp_path / "elsewhere" / "x.md", SHORT).parent
    os.symlink(outside, tree / "link", target_is_directory=True)
    kb = _files_kb(alice)
    report, _ = _index(kb, tree)
    assert report.added == 3
    assert _key(outside / "x.md") not in _counts(kb)


def test_undecodable_file_is_skipped_with_a_reason(alice, tree):
    _write(tree / "bad.txt", b"\xff\xfe not utf-8")
    kb = _files_kb(alice)
    report, events = _index(kb, tree)
    assert report == _report(added=3, skipped=1, chunks_written=5)
    bad = [e for e in events if e.action == "skipped"]
    assert [(e.path.name, e.reason) for e in bad] == [
        ("bad.txt", "not valid utf-8 at byte 0: invalid start byte")
    ]
    report, _ = _index(kb, tree / "bad.txt", encoding="latin-1")
    assert report == _report(added=1, chunks_written=1)


def test_binary_file_with_nul_bytes_is_skipped(alice, tmp_path):
    _write(tmp_path / "blob.txt", b"abc\x00def")
    kb = _files_kb(alice)
    report, events = _index(kb, tmp_path)
    assert report == _report(skipped=1)
    assert events[0].reason == "contains NUL characters (binary file?)"


def test_dry_run_writes_nothing(alice, tree, no_embedding):
    kb = _files_kb(alice)
    report, events = _index(kb, tree, dry_run=True)
    assert report == _report(added=3, chunks_written=5)
    assert [e.action for e in events] == ["added", "added", "added"]
    assert Chunk.objects.filter(knowledge_base=kb).count() == 0
    kb.refresh_from_db()
    assert kb.chunk_count == 0


def test_dry_run_reports_changes_and_deletions_without_writing(alice, tree):
    kb = _files_kb(alice)
    _index(kb, tree)
    before = _snapshot(kb)
    _write(tree / "b.txt", "changed")
    (tree / "a.md").unlink()
    report, _ = _index(kb, tree, dry_run=True)
    assert report == _report(updated=1, unchanged=1, deleted=1, chunks_written=1)
    assert _snapshot(kb) == before


def test_documents_base_refuses(alice, tree):
    kb = make_kb(alice, name="api")
    with pytest.raises(KnowledgeError, match="not file-backed"):
        _index(kb, tree)
    assert _counts(kb) == {}


def test_missing_path_and_unknown_encoding_are_refused(alice, tree):
    kb = _files_kb(alice)
    with pytest.raises(KnowledgeError, match="path does not exist"):
        _index(kb, tree / "nope")
    with pytest.raises(KnowledgeError, match="unknown encoding"):
        _index(kb, tree, encoding="klingon-8")
    assert _counts(kb) == {}


def test_indexing_one_root_never_deletes_another_roots_chunks(alice, tmp_path):
    root_a = tmp_path / "a"
    root_b = tmp_path / "b"
    _write(root_a / "one.md", SHORT)
    b_file = _write(root_b / "two.md", LONG)
    kb = _files_kb(alice)
    _index(kb, root_a, root_b)
    b_file.unlink()
    report, _ = _index(kb, root_a)
    assert report == _report(unchanged=1)
    assert _counts(kb) == {_key(root_a / "one.md"): 1, _key(b_file): 3}
    report, _ = _index(kb, root_b)
    assert report == _report(deleted=1)
    assert _counts(kb) == {_key(root_a / "one.md"): 1}


def test_sibling_directory_with_a_common_prefix_is_out_of_scope(alice, tmp_path):
    kb = _files_kb(alice)
    gone = _write(tmp_path / "notes-old" / "x.md", SHORT)
    _write(tmp_path / "notes" / "y.md", SHORT)
    _index(kb, tmp_path / "notes-old", tmp_path / "notes")
    gone.unlink()
    report, _ = _index(kb, tmp_path / "notes")
    assert report == _report(unchanged=1)
    assert _key(gone) in _counts(kb)


def test_large_directories_are_ingested_in_batches(alice, tmp_path, monkeypatch):
    for i in range(5):
        _write(tmp_path / f"f{i}.md", LONG)
    batches: list[int] = []
    real_ingest = services.knowledge_base_ingest

    def counting_ingest(**kwargs):
        batches.append(len(kwargs["documents"]))
        return real_ingest(**kwargs)

    monkeypatch.setattr("knowledge.files.knowledge_base_ingest", counting_ingest)
    monkeypatch.setattr("knowledge.files.BATCH_CHUNKS", 6)
    kb = _files_kb(alice)
    report, events = _index(kb, tmp_path)
    assert batches == [2, 2, 1]
    assert report == _report(added=5, chunks_written=15)
    assert [e.position for e in events] == [1, 2, 3, 4, 5]


# --- management command ----------------------------------------------------------------
def _command(*args: str) -> str:
    out = StringIO()
    call_command("index_files", *args, stdout=out)
    return out.getvalue()


def test_command_prints_progress_and_summary(alice, tree):
    kb = _files_kb(alice)
    output = _command("docs", str(tree), "--owner", "alice")
    resolved = tree.resolve()
    assert output.splitlines() == [
        f"[1/3] added {resolved / 'a.md'} (3 chunks)",
        f"[2/3] added {resolved / 'b.txt'} (1 chunk)",
        f"[3/3] added {resolved / 'sub' / 'c.md'} (1 chunk)",
        "added=3 updated=0 unchanged=0 deleted=0 skipped=0 chunks=5",
    ]
    (tree / "b.txt").unlink()
    output = _command(str(kb.pk), str(tree), "--no-recursive", "--suffix", ".md")
    assert output.splitlines() == [
        f"[1/2] unchanged {resolved / 'a.md'} (3 chunks)",
        f"[2/2] deleted {resolved / 'b.txt'} (1 chunk; file no longer exists)",
        "added=0 updated=0 unchanged=1 deleted=1 skipped=0 chunks=0",
    ]


def test_command_dry_run_and_create(alice, tree):
    output = _command("fresh", str(tree / "a.md"), "--owner", "alice", "--create", "--dry-run")
    assert output.splitlines()[0] == "Would create file-backed knowledge base 'fresh' for alice."
    assert output.splitlines()[-1] == (
        "dry run: added=1 updated=0 unchanged=0 deleted=0 skipped=0 chunks=3"
    )
    assert not KnowledgeBase.objects.filter(name="fresh").exists()
    output = _command("fresh", str(tree / "a.md"), "--owner", "alice", "--create")
    kb = KnowledgeBase.objects.get(owner=alice, name="fresh")
    assert (kb.source_kind, kb.chunk_size, kb.chunk_overlap, kb.chunk_count) == (
        "files",
        500,
        50,
        3,
    )
    assert output.splitlines()[-1] == "added=1 updated=0 unchanged=0 deleted=0 skipped=0 chunks=3"


def test_command_reports_skipped_files_with_reason(alice, tree):
    _files_kb(alice)
    _write(tree / "bad.txt", b"\xff")
    output = _command("docs", str(tree / "bad.txt"))
    assert output.splitlines() == [
        f"[1/1] skipped {(tree / 'bad.txt').resolve()} "
        "(not valid utf-8 at byte 0: invalid start byte)",
        "added=0 updated=0 unchanged=0 deleted=0 skipped=1 chunks=0",
    ]


def test_command_errors(alice, bob, tree):
    with pytest.raises(CommandError, match="Unknown knowledge base 'nope'"):
        _command("nope", str(tree))
    with pytest.raises(CommandError, match="--create needs --owner"):
        _command("nope", str(tree), "--create")
    with pytest.raises(CommandError, match="No user named 'carol'"):
        _command("docs", str(tree), "--owner", "carol")
    # (a name too long for the column was a DataError traceback)
    with pytest.raises(CommandError, match="^name must be at most 200 characters, not 300$"):
        _command("N" * 300, str(tree), "--owner", "alice", "--create")
    with pytest.raises(CommandError, match="^name must not be blank$"):
        _command("  ", str(tree), "--owner", "alice", "--create")
    assert not KnowledgeBase.objects.exists()
    make_kb(alice, name="api")
    with pytest.raises(CommandError, match="'api' is not file-backed"):
        _command("api", str(tree))
    _files_kb(alice)
    with pytest.raises(CommandError, match="Path does not exist"):
        _command("docs", str(tree / "missing"))
    _files_kb(bob)
    with pytest.raises(CommandError, match=r"'docs' is ambiguous \(owners: alice, bob\)"):
        _command("docs", str(tree))
    assert Chunk.objects.count() == 0
    _command("docs", str(tree), "--owner", "bob")
    assert set(Chunk.objects.values_list("knowledge_base__owner__username", flat=True)) == {"bob"}


# --- API -------------------------------------------------------------------------------
def test_api_refuses_writes_to_a_file_backed_base(alice, alice_client, tree):
    kb = _files_kb(alice)
    _index(kb, tree)
    before = _snapshot(kb)
    response = alice_client.post(
        f"/api/v1/knowledge-bases/{kb.pk}/documents",
        {"documents": [{"text": "sneaky", "source_key": "x", "metadata": {}}]},
        format="json",
    )
    assert response.status_code == 409
    error = response.json()["error"]
    assert error["code"] == "read_only"
    assert error["message"] == "this knowledge base indexes files and is read-only here"
    assert _snapshot(kb) == before
    kb.refresh_from_db()
    assert kb.chunk_count == 5
