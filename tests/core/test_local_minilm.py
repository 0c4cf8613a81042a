"""Tests for the torch-free all-MiniLM-L6-v2 embedder (core.providers.local_minilm).

Plain pytest: no Django, no database.  Reference vectors come from the real
sentence-transformers library (tests/fixtures/make_minilm_reference.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:  # allow running without `python -m pytest`
    sys.path.insert(0, str(REPO_ROOT))

from core.providers import local_minilm  # noqa: E402
from core.providers.local_minilm import MiniLMEncoder, model_dir  # noqa: E402

FIXTURE = REPO_ROOT / "tests" / "fixtures" / "minilm_reference.json"
MIN_COSINE = 0.999


@pytest.fixture(scope="module")
def reference() -> dict:
    return json.loads(FIXTURE.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def ref_texts(reference) -> list[str]:
    return [item["text"] for item in reference["items"]]


@pytest.fixture(scope="module")
def short_texts(ref_texts) -> list[str]:
    """The fixture sentences without the two long paragraphs (keeps slow tests fast)."""
    return [t for t in ref_texts if len(t.split()) < 60]


@pytest.fixture(scope="module")
def ref_vectors(reference) -> np.ndarray:
    return np.asarray([item["vector"] for item in reference["items"]], dtype=np.float32)


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("minilm-cache")


@pytest.fixture(scope="module")
def onnx_encoder(shared_cache) -> MiniLMEncoder:
    return MiniLMEncoder(cache_dir=shared_cache, backend="onnx").load()


@pytest.fixture(scope="module")
def numpy_encoder(tmp_path_factory) -> MiniLMEncoder:
    return MiniLMEncoder(cache_dir=tmp_path_factory.mktemp("minilm-np"), backend="numpy").load()


@pytest.fixture(params=["onnx", "numpy"])
def encoder(request) -> MiniLMEncoder:
    return request.getfixturevalue(f"{request.param}_encoder")


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


# --------------------------------------------------------------------------- #
# model files / fixture sanity
# --------------------------------------------------------------------------- #


def test_model_dir_points_at_bundled_files():
    d = model_dir()
    for name in ("model.safetensors", "tokenizer.json", "config.json", "sentence_bert_config.json"):
        assert (d / name).is_file(), name
    assert (d / "1_Pooling" / "config.json").is_file()


def test_fixture_matches_bundled_weights_and_covers_edge_cases(reference, ref_texts):
    import hashlib

    digest = hashlib.sha256((model_dir() / "model.safetensors").read_bytes()).hexdigest()
    assert reference["model_safetensors_sha256"] == digest
    assert reference["max_seq_length"] == 256
    assert len(ref_texts) >= 10
    assert any(len(t.split()) > 300 for t in ref_texts), "needs a long (> 300 words) text"
    assert "a" in ref_texts


@pytest.mark.slow  # starts a process
def test_module_does_not_pull_torch_or_hub(tmp_path):
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from core.providers.local_minilm import MiniLMEncoder\n"
        f"v = MiniLMEncoder(cache_dir=Path({str(tmp_path)!r}), backend='numpy').encode(['hello'])\n"
        "assert v.shape == (1, 384)\n"
        "heavy = ('torch', 'transformers', 'sentence_transformers', 'huggingface_hub')\n"
        "bad = [m for m in heavy if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr


# --------------------------------------------------------------------------- #
# tokenizer
# --------------------------------------------------------------------------- #


def test_tokenizer_ids_match_sentence_transformers(numpy_encoder, reference):
    for item in reference["items"]:
        ids, mask = numpy_encoder.tokenize([item["text"]])
        assert ids.dtype == np.int64 and mask.dtype == np.int64
        assert ids[0].tolist() == item["input_ids"], item["text"][:40]
        assert mask[0].tolist() == [1] * len(item["input_ids"])


def test_truncation_is_max_seq_length_not_tokenizer_json_default(numpy_encoder, ref_texts):
    # tokenizer.json says 128; sentence-transformers uses max_seq_length = 256.
    assert numpy_encoder.max_seq_length == 256
    long_text = max(ref_texts, key=len)
    assert len(long_text.split()) > 300
    ids, mask = numpy_encoder.tokenize([long_text])
    assert ids.shape == (1, 256)
    assert ids[0, 0] == 101 and ids[0, -1] == 102  # [CLS] ... [SEP] kept after truncation
    # A text between 128 and 256 tokens must not be truncated at all.
    medium = [t for t in ref_texts if 128 < len(numpy_encoder.tokenize([t])[0][0]) < 256]
    assert medium, "fixture should contain a 128..256-token text"


def test_padding_is_to_longest_in_batch(numpy_encoder):
    ids, mask = numpy_encoder.tokenize(["a", "hello there world"])
    assert ids.shape == (2, 5)  # [CLS] hello there world [SEP]
    assert mask.tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]
    assert ids[0, 3:].tolist() == [0, 0]


# --------------------------------------------------------------------------- #
# parity with sentence-transformers
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("backend", ["onnx", "numpy"])
def test_parity_with_reference(backend, request, ref_texts, ref_vectors):
    enc = request.getfixturevalue(f"{backend}_encoder")
    assert enc.backend == backend
    got = enc.encode(ref_texts)
    cos = _cosines(got, ref_vectors)
    bad = {ref_texts[i][:40]: float(c) for i, c in enumerate(cos) if c < MIN_COSINE}
    assert not bad, f"cosine < {MIN_COSINE}: {bad}"


def test_backends_agree(onnx_encoder, numpy_encoder, ref_texts):
    cos = _cosines(onnx_encoder.encode(ref_texts), numpy_encoder.encode(ref_texts))
    assert cos.min() >= 0.9999


# --------------------------------------------------------------------------- #
# output contract
# --------------------------------------------------------------------------- #


def test_shape_dtype_and_unit_norm(encoder, ref_texts):
    out = encoder.encode(ref_texts)
    assert isinstance(out, np.ndarray)
    assert out.shape == (len(ref_texts), 384)
    assert out.dtype == np.float32
    assert np.all(np.isfinite(out))
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, atol=1e-5)
    assert encoder.dimensions == 384
    assert encoder.model_name == "sentence-transformers/all-MiniLM-L6-v2"


def test_empty_input(encoder):
    out = encoder.encode([])
    assert out.shape == (0, 384) and out.dtype == np.float32


def test_rejects_bare_string(encoder):
    with pytest.raises(TypeError):
        encoder.encode("not a list")


def test_batch_vs_single_consistency(encoder, ref_texts):
    batched = encoder.encode(ref_texts, batch_size=32)
    small_batches = encoder.encode(ref_texts, batch_size=5)
    single = np.stack([encoder.encode([t])[0] for t in ref_texts])
    assert _cosines(batched, single).min() >= 0.99999
    assert _cosines(small_batches, single).min() >= 0.99999
    np.testing.assert_allclose(batched, single, atol=1e-5)


@pytest.mark.parametrize("tokens_per_call", [1, 10**6])
def test_micro_batching_and_heavy_padding(
    encoder, ref_texts, ref_vectors, monkeypatch, tokens_per_call
):
    # 1: every sentence runs alone; 10**6: all 12 run in one call, short ones padded to 256.
    monkeypatch.setattr(encoder, "tokens_per_call", tokens_per_call)
    got = encoder.encode(ref_texts)
    assert _cosines(got, ref_vectors).min() >= MIN_COSINE
    monkeypatch.undo()
    np.testing.assert_allclose(got, encoder.encode(ref_texts), atol=1e-5)


def test_order_is_preserved(encoder, short_texts):
    forward = encoder.encode(short_texts)
    backward = encoder.encode(short_texts[::-1])
    np.testing.assert_allclose(forward, backward[::-1], atol=1e-5)


def test_deterministic_across_calls(encoder, short_texts):
    first = encoder.encode(short_texts)
    second = encoder.encode(short_texts)
    np.testing.assert_allclose(first, second, rtol=0, atol=1e-6)


def test_concurrent_encode_from_threads(encoder, short_texts):
    expected = encoder.encode(short_texts)
    results: list[np.ndarray] = [None] * 6  # type: ignore[list-item]
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            results[i] = encoder.encode(short_texts, batch_size=4)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(results))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for r in results:
        np.testing.assert_allclose(r, expected, atol=1e-5)


# --------------------------------------------------------------------------- #
# ONNX graph cache
# --------------------------------------------------------------------------- #


def test_cached_graph_is_reused(tmp_path, ref_texts):
    first = MiniLMEncoder(cache_dir=tmp_path, backend="onnx")
    assert first.backend == "onnx"
    assert first.graph_built
    graphs = list(tmp_path.glob("all-MiniLM-L6-v2-*.onnx"))
    assert graphs == [first.graph_path]
    mtime = first.graph_path.stat().st_mtime_ns
    assert not list(tmp_path.glob("*.tmp")), "temp file left behind"

    second = MiniLMEncoder(cache_dir=tmp_path, backend="onnx")
    assert second.backend == "onnx"
    assert not second.graph_built
    assert second.graph_path == first.graph_path
    assert first.graph_path.stat().st_mtime_ns == mtime
    np.testing.assert_allclose(first.encode(ref_texts), second.encode(ref_texts), atol=1e-6)


def test_corrupt_cached_graph_is_rebuilt(tmp_path, onnx_encoder, ref_texts):
    path = tmp_path / onnx_encoder.graph_path.name
    path.write_bytes(b"not an onnx model")
    enc = MiniLMEncoder(cache_dir=tmp_path, backend="onnx")
    assert enc.backend == "onnx" and enc.graph_built
    assert path.stat().st_size > 80_000_000
    np.testing.assert_allclose(
        enc.encode(ref_texts[:3]), onnx_encoder.encode(ref_texts[:3]), atol=1e-6
    )


def test_lazy_build_happens_once_under_concurrency(tmp_path, monkeypatch, ref_texts):
    calls = []
    real_build = local_minilm._build_onnx_model

    def counting_build(*args, **kwargs):
        calls.append(1)
        return real_build(*args, **kwargs)

    monkeypatch.setattr(local_minilm, "_build_onnx_model", counting_build)
    enc = MiniLMEncoder(cache_dir=tmp_path, backend="onnx")
    outs: list[np.ndarray] = []
    threads = [
        threading.Thread(target=lambda: outs.append(enc.encode(ref_texts[:4]))) for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1
    assert len(outs) == 4


# --------------------------------------------------------------------------- #
# backend selection
# --------------------------------------------------------------------------- #


def test_auto_prefers_onnx(shared_cache, onnx_encoder):
    enc = MiniLMEncoder(cache_dir=shared_cache, backend="auto")
    assert enc.backend == "onnx"
    assert not enc.graph_built  # reused the graph built by onnx_encoder


def test_auto_falls_back_to_numpy_without_onnx_and_without_cache(
    tmp_path, monkeypatch, ref_texts, ref_vectors
):
    monkeypatch.setattr(local_minilm, "_onnx_available", lambda: False)
    enc = MiniLMEncoder(cache_dir=tmp_path, backend="auto")
    assert enc.backend == "numpy"
    assert not list(tmp_path.glob("*.onnx"))
    assert _cosines(enc.encode(ref_texts[:2]), ref_vectors[:2]).min() >= MIN_COSINE


def test_onnx_package_not_needed_when_graph_is_cached(shared_cache, onnx_encoder, monkeypatch):
    monkeypatch.setattr(local_minilm, "_onnx_available", lambda: False)
    enc = MiniLMEncoder(cache_dir=shared_cache, backend="auto")
    assert enc.backend == "onnx"


def test_auto_falls_back_to_numpy_without_onnxruntime(shared_cache, monkeypatch):
    monkeypatch.setattr(local_minilm, "_onnxruntime_available", lambda: False)
    enc = MiniLMEncoder(cache_dir=shared_cache, backend="auto")
    assert enc.backend == "numpy"


def test_explicit_onnx_raises_when_unavailable(tmp_path, monkeypatch):
    monkeypatch.setattr(local_minilm, "_onnxruntime_available", lambda: False)
    with pytest.raises(RuntimeError):
        MiniLMEncoder(cache_dir=tmp_path, backend="onnx").load()


def test_invalid_backend():
    with pytest.raises(ValueError):
        MiniLMEncoder(cache_dir=Path("/tmp"), backend="torch")
