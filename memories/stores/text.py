"""Snapshots of what a node read and wrote, the summary that is searched, and the
lexical score blended with the cosine."""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings

from core.errors import InvalidInput

BLOCK_TYPES = ("text", "image", "file")


@dataclass(frozen=True)
class Snapshot:
    """``{text, blocks[]}``: text blocks, and image/file blocks as a reference (``url``)
    or inline base64 (``data``, kept up to ``MEMORY_STORE_INLINE_MAX_BYTES``)."""

    text: str = ""
    blocks: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"text": self.text, "blocks": self.blocks}


def _block(raw: Any, where: str) -> dict[str, Any]:
    if not isinstance(raw, dict) or raw.get("type") not in BLOCK_TYPES:
        raise InvalidInput.at(where, f"a block is an object with type {', '.join(BLOCK_TYPES)}")
    kind = raw["type"]
    if kind == "text":
        if not isinstance(raw.get("text"), str):
            raise InvalidInput.at(f"{where}.text", "must be a string")
        return {"type": "text", "text": raw["text"]}
    out = {k: raw[k] for k in ("url", "name", "mime_type") if isinstance(raw.get(k), str)}
    out["type"] = kind
    data = raw.get("data")
    if data is None:
        if "url" not in out:
            raise InvalidInput.at(
                where, f"an {kind} block needs url (a reference) or data (base64)"
            )
        return out
    try:
        decoded = base64.b64decode(str(data), validate=True)
    except (binascii.Error, ValueError):
        raise InvalidInput.at(f"{where}.data", "not valid base64") from None
    out["size"] = len(decoded)
    out["sha256"] = hashlib.sha256(decoded).hexdigest()
    if len(decoded) <= settings.MEMORY_STORE_INLINE_MAX_BYTES:
        out["data"] = str(data)
    else:
        out["omitted"] = "data over MEMORY_STORE_INLINE_MAX_BYTES; kept as a reference"
    return out


def snapshot_from(raw: Any, where: str) -> Snapshot:
    """A plain string or ``{text, blocks}``; text defaults to the text blocks joined."""
    if raw is None:
        return Snapshot()
    if isinstance(raw, str):
        return Snapshot(text=raw)
    if not isinstance(raw, dict) or set(raw) - {"text", "blocks"}:
        raise InvalidInput.at(where, "a string or an object with text and blocks")
    blocks_in = raw.get("blocks") or []
    if not isinstance(blocks_in, list):
        raise InvalidInput.at(f"{where}.blocks", "must be a list")
    blocks = [_block(b, f"{where}.blocks[{i}]") for i, b in enumerate(blocks_in)]
    text = raw.get("text")
    if text is not None and not isinstance(text, str):
        raise InvalidInput.at(f"{where}.text", "must be a string")
    if not text:
        text = "\n".join(b["text"] for b in blocks if b["type"] == "text")
    return Snapshot(text=text, blocks=blocks)


def attachment_overview(*snapshots: Snapshot) -> list[dict[str, Any]]:
    return [
        {k: b[k] for k in ("type", "name", "mime_type", "url", "size") if k in b}
        for snap in snapshots
        for b in snap.blocks
        if b["type"] != "text"
    ]


# --- summaries ----------------------------------------------------------------------
_SPACE = re.compile(r"\s+")
# Templated instructions that say nothing about the turn itself.
_BOILERPLATE = [
    re.compile(r"(?:Agent|Model) Role:.*?(?:\.|$)", re.IGNORECASE),
    re.compile(r"\bYou are (?:a|an|the) [^.,;]{0,120}[.,;]\s*", re.IGNORECASE),
    re.compile(r"\b(?:User will input|You need to|As an AI[^,.]*)[^.,;]{0,160}[.,;]\s*", re.I),
]
_SENTENCE_END = re.compile(r"(?<=[.!?。！？；])\s+|(?<=[。！？；])")


def key_content(text: str, *, max_chars: int, min_sentence: int = 20, sentences: int = 3) -> str:
    """The first ``sentences`` sentences of at least ``min_sentence`` characters,
    boilerplate stripped, whitespace collapsed, cut near ``max_chars`` on a word."""
    text = _SPACE.sub(" ", text).strip()
    if len(text) > 100:
        for pattern in _BOILERPLATE:
            text = pattern.sub("", text).strip()
    parts = [p.strip() for p in _SENTENCE_END.split(text) if p.strip()]
    kept = [p for p in parts if len(p) >= min_sentence][:sentences]
    out = " ".join(kept) if kept else text
    if len(out) > max_chars:
        cut = out[:max_chars]
        space = cut.rfind(" ")
        out = (cut[:space] if space > max_chars // 2 else cut).rstrip(" ,;:") + "…"
    return out


def turn_summary(input_text: str, output_text: str, *, max_chars: int) -> str:
    """``Input: … Output: …`` of the turn: the input gets up to 40% of the budget."""
    output = key_content(output_text, max_chars=max_chars)
    if not input_text.strip():
        return f"Output: {output}" if output else ""
    room = max(max_chars - len(output), max_chars * 2 // 5)
    inp = key_content(input_text, max_chars=min(room, max_chars * 2 // 5))
    return f"Input: {inp} Output: {output}" if output else f"Input: {inp}"


def summary_hash(summary: str) -> str:
    return hashlib.sha256(_SPACE.sub(" ", summary).strip().lower().encode()).hexdigest()
