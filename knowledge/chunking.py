"""Character chunking on word boundaries with overlap."""

from __future__ import annotations


def chunk_text(text: str, *, size: int, overlap: int) -> list[str]:
    """Split ``text`` into pieces of at most ``size`` characters, cutting at whitespace.

    Consecutive pieces share about ``overlap`` characters, also aligned to word
    starts. A single word longer than ``size`` is cut hard. Whitespace-only input
    gives no chunks.
    """
    if size < 1 or not 0 <= overlap < size:
        raise ValueError("chunk size must be >= 1 and overlap in [0, size)")
    text = text.strip()
    if not text:
        return []
    if len(text) <= size:
        return [text]
    chunks: list[str] = []
    start = 0
    length = len(text)
    while start < length:
        end = min(start + size, length)
        if end < length:
            cut = text.rfind(" ", start + 1, end + 1)
            cut = max(cut, text.rfind("\n", start + 1, end + 1))
            if cut > start:
                end = cut
        piece = text[start:end].strip()
        if piece:
            chunks.append(piece)
        if end >= length:
            break
        next_start = max(end - overlap, start + 1)
        # Start the next piece at a word start, but never past this piece's end.
        if next_start < end and not text[next_start - 1].isspace():
            space = text.find(" ", next_start, end)
            next_start = space + 1 if space != -1 else end
        while next_start < length and text[next_start].isspace():
            next_start += 1
        start = next_start
    return chunks
