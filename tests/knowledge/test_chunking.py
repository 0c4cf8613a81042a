import pytest

from knowledge.chunking import chunk_text


def test_short_text_is_one_chunk():
    assert chunk_text("  hello world  ", size=100, overlap=10) == ["hello world"]


def test_blank_text_gives_no_chunks():
    assert chunk_text(" \n\t ", size=100, overlap=10) == []


def test_cuts_on_word_boundaries_with_overlap():
    words = [f"w{i:03d}" for i in range(100)]  # 4 chars + space
    chunks = chunk_text(" ".join(words), size=50, overlap=10)
    for chunk in chunks:
        assert len(chunk) <= 50
        assert all(token in words for token in chunk.split())  # no word cut in half
    # Every word appears, in order, and consecutive chunks share the overlap.
    seen = [t for c in chunks for t in c.split()]
    assert sorted(set(seen)) == words
    for a, b in zip(chunks, chunks[1:]):
        assert a.split()[-1] == b.split()[0] or a.split()[-2] == b.split()[0]


def test_exact_pieces_for_a_small_example():
    assert chunk_text("aaa bbb ccc ddd eee", size=8, overlap=4) == [
        "aaa bbb",
        "bbb ccc",
        "ccc ddd",
        "ddd eee",
    ]
    assert chunk_text("aaa bbb ccc ddd eee", size=8, overlap=0) == ["aaa bbb", "ccc ddd", "eee"]


def test_overlong_word_is_cut_hard():
    # No word start inside the cut word, so the next piece starts at the cut itself.
    assert chunk_text("x" * 25, size=10, overlap=2) == ["x" * 10, "x" * 10, "x" * 5]


@pytest.mark.parametrize(("size", "overlap"), [(0, 0), (10, 10), (10, -1)])
def test_invalid_parameters(size, overlap):
    with pytest.raises(ValueError):
        chunk_text("text", size=size, overlap=overlap)
