"""The output head at a constrained field's allowed tokens only (`passes.head.head_at`,
`Chunk.narrow`).

A pruned field scored constrained reads each level's logits at its nodes' tokens alone:
the head's rows for those tokens equal the whole head's columns (bit for bit on the int8
kernels), and the decisions equal those that read the whole vocabulary.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import numpy as np
import pytest
from pydantic import BaseModel, Field

from pcd_tools import Decider
from pcd_tools.engine.host.blas import import_mlx
from pcd_tools.engine.passes import edges, forward, prune
from pcd_tools.engine.passes.head import head_at
from pcd_tools.engine.passes.pack import make_chunks
from pcd_tools.schema import compile_schema
from tests.engine.test_properties import decider  # the tiny model, numpy kernels off

mx = import_mlx()
import mlx.nn as nn  # noqa: E402

pytestmark = pytest.mark.engine

CODES = tuple(f"{a}{b}{c}" for a in "0123456789" for b in "abcdef" for c in "xyz")[:150]
CONTEXTS = ["some text here", "a third one, longer than the others"]


class Coded(BaseModel):
    code: Literal[CODES] = Field(description="the code")  # type: ignore[valid-type]
    flag: bool = Field(description="a flag")


class Digits(BaseModel):
    """Pick a code."""

    code: Literal[tuple(f"{i:03d}" for i in range(0, 1000, 7))] = Field(  # type: ignore[valid-type]
        description="the code"
    )


TOKENS = np.array([3, 17, 18, 40, 41, 250], np.int64)


def _x(d: int, rows: int = 5) -> mx.array:
    return mx.array(np.random.default_rng(1).standard_normal((1, rows, d)).astype(np.float32))


def _whole(head, x) -> np.ndarray:
    return np.array(head(x).astype(mx.float32))[..., TOKENS]


def test_head_at_equals_the_whole_heads_columns_on_mlx_layers():
    lin = nn.Linear(64, 300, bias=True)
    emb = nn.Embedding(300, 64)
    mx.eval(lin.parameters(), emb.parameters())
    x = _x(64)
    for head in (lin, emb.as_linear):
        np.testing.assert_allclose(head_at(head, x, TOKENS), _whole(head, x), rtol=1e-5, atol=1e-5)
    q = nn.QuantizedLinear.from_linear(lin, group_size=32, bits=4)
    np.testing.assert_allclose(head_at(q, x, TOKENS), _whole(q, x), rtol=1e-5, atol=1e-5)
    # a head of another kind: the whole vocabulary, then the columns
    other = lambda h: lin(h) * 2.0  # noqa: E731
    np.testing.assert_allclose(head_at(other, x, TOKENS), _whole(other, x), rtol=1e-6)
    assert head_at(lin, x, TOKENS).shape == (1, 5, len(TOKENS))


@pytest.mark.parametrize("compute", ["int8", "float32"])
def test_head_at_on_a_gguf_head(tiny_file, compute):
    dec = Decider.load(tiny_file, dtype="quantized", compute=compute)
    passes = dec.engine.passes
    x = _x(int(passes.head.weight.shape[1]) if hasattr(passes.head, "weight") else 64)
    got = head_at(passes.head, x, TOKENS)
    want = np.array(passes.logits_at(x, slice(None), mx.arange(5)))[..., TOKENS]
    if compute == "int8":  # each output column is summed on its own: the same bits
        assert np.array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


@pytest.fixture(scope="module")
def tied_file(tmp_path_factory):
    """The tiny GGUF shape with a tied head: the embedding table is the output head."""
    pytest.importorskip("gguf")
    from benchmarks.model_size import SHAPES, write_random_gguf
    from pcd_tools.engine.load.sources import embedded_model_path

    shape = dataclasses.replace(SHAPES["tiny"], name="tiny-tied", tied=True)
    path = tmp_path_factory.mktemp("tied") / "tied.gguf"
    return write_random_gguf(path, shape, embedded_model_path(), seed=6)


@pytest.mark.parametrize("compute", ["int8", "float32"])
def test_head_at_on_a_tied_gguf_embedding(tied_file, compute):
    dec = Decider.load(tied_file, dtype="quantized", compute=compute)
    passes = dec.engine.passes
    assert getattr(passes.head, "__name__", "") == "as_linear"  # the table, read as a head
    x = _x(int(passes.head.__self__.weight.shape[1]))
    got = head_at(passes.head, x, TOKENS)
    want = np.array(passes.logits_at(x, slice(None), mx.arange(5)))[..., TOKENS]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
    if passes.head.__self__.weight.compute == "int8":
        assert np.array_equal(got, want)


def test_take_rows_keeps_the_row_order_and_checks_its_indices(tiny_file):
    dec = Decider.load(tiny_file, dtype="quantized", compute="int8")
    w = dec.engine.model.model.layers[0].self_attn.q_proj.weight  # rows un-permuted
    assert w.rows is not None
    rows = np.array([5, 0, 3])
    sub = w.take_rows(rows)
    assert sub.shape == (3, w.shape[1]) and sub.compute == "int8" and sub.rows is None
    np.testing.assert_array_equal(sub.dequantize(), w.dequantize(rows))
    with pytest.raises(IndexError, match="out of range"):
        w.take_rows(np.array([w.shape[0]]))


def _spy(monkeypatch):
    seen = []
    orig = forward.Passes.chunk_scored

    def spy(self, plan, ch, out, offset=0):
        seen.append((ch.narrow, len(ch.narrow_tokens), ch.slot_split()))
        return orig(self, plan, ch, out, offset)

    monkeypatch.setattr(forward.Passes, "chunk_scored", spy)
    return seen


def _decide(dec, schema, **kw):
    return dec.decide_many(schema, CONTEXTS, **kw)


def _same(a, b, tol):
    for x, y in zip(a, b):
        for name, f in x.fields.items():
            g = y.fields[name]
            assert f.label == g.label and f.certified == g.certified, name
            assert f.search == g.search, name
            za, zb = np.array(f.log_scores), np.array(g.log_scores)
            assert np.array_equal(np.isfinite(za), np.isfinite(zb)), name
            seen = np.isfinite(za)
            np.testing.assert_allclose(za[seen], zb[seen], rtol=0, atol=tol)
            np.testing.assert_allclose(f.probability, g.probability, rtol=0, atol=tol)


@pytest.mark.parametrize("scoring", ["constrained", "auto"])
def test_a_pruned_constrained_field_reads_its_tokens_only(monkeypatch, scoring):
    dec = decider()
    seen = _spy(monkeypatch)
    narrow = _decide(dec, Coded, pruning="on", scoring=scoring)
    # "constrained" prunes both fields; "auto" the large one only, and the flag (the
    # whole vocabulary) shares the first chunk with its root
    want = frozenset({0, 1}) if scoring == "constrained" else frozenset({0})
    assert seen and all(n == want for n, _, _ in seen), seen
    mixed = any(len(full) and len(nar) for _, _, (full, nar) in seen)
    assert mixed == (scoring == "auto")
    assert all(0 < k <= 20 for _, k, _ in seen)  # the field's tokens, not 259
    monkeypatch.setattr(prune, "_narrow", lambda *a: frozenset())
    seen.clear()
    whole_vocab = _decide(dec, Coded, pruning="on", scoring=scoring)
    assert seen and not any(n for n, _, _ in seen)
    _same(narrow, whole_vocab, 1e-5)  # float32 products: the head's own rounding
    # and the exhaustive pass, which reads the whole vocabulary
    off = _decide(dec, Coded, pruning="off", scoring=scoring)
    for p, w in zip(narrow, off):
        f, g = p.fields["code"], w.fields["code"]
        assert f.certified and f.label == g.label
        z, zw = np.array(f.log_scores), np.array(g.log_scores)
        ok = np.isfinite(z)
        np.testing.assert_allclose(z[ok], zw[ok], rtol=1e-5, atol=1e-4)  # as test_pruning


def test_full_scoring_and_unpruned_fields_read_the_whole_vocabulary(monkeypatch):
    dec = decider()
    seen = _spy(monkeypatch)
    _decide(dec, Coded, pruning="on", scoring="full")
    assert seen and not any(n for n, _, _ in seen)
    seen.clear()
    _decide(dec, Coded, pruning="off", scoring="constrained")
    assert seen and not any(n for n, _, _ in seen)


@pytest.mark.parametrize("file", ["tiny_file", "tied_file"])
def test_int8_pruned_decisions_are_the_same_with_the_whole_head(file, request, monkeypatch):
    dec = Decider.load(request.getfixturevalue(file), compute="int8")
    seen = _spy(monkeypatch)
    narrow = _decide(dec, Digits)
    assert seen and all(n == frozenset({0}) for n, _, _ in seen)
    assert narrow[0].fields["code"].search is not None
    monkeypatch.setattr(prune, "_narrow", lambda *a: frozenset())
    _same(narrow, _decide(dec, Digits), 1e-12)  # the same logits: only the lse differs


def test_narrow_edges_are_each_nodes_constrained_log_p():
    """`chunk_edges` on the same logits: a narrow field's edges equal the whole
    vocabulary's log p renormalised over each node's edges (`edge_scores`)."""
    dec = decider()
    plan = dec.engine.plan(compile_schema(Coded))
    (ch,) = make_chunks(plan.tries, 10_000, 1)
    (nch,) = make_chunks(plan.tries, 10_000, 1, narrow=frozenset({0}))
    assert nch.narrow == frozenset({0}) and not ch.narrow
    full_rows, narrow_rows = nch.slot_split()
    assert set(full_rows) | set(narrow_rows) == set(range(len(ch.slots)))
    logits = np.random.default_rng(2).standard_normal((2, len(ch.slots), 259)).astype(np.float32)
    whole = edges.chunk_edges(plan, ch, logits)
    got = edges.chunk_edges(
        plan, nch, logits[:, full_rows], logits[:, narrow_rows][..., nch.narrow_tokens]
    )
    for (fi, sel, lp), (fj, sel2, lp2) in zip(whole, got):
        assert fi == fj and np.array_equal(sel, sel2)
        trie = plan.tries[fi]
        for b in range(2):
            full = np.full(len(trie.edge_node), np.nan)
            full[sel] = lp[b]
            mine = np.full(len(trie.edge_node), np.nan)
            mine[sel] = lp2[b]
            if fi == 0:
                want = trie.edge_scores(full, constrained=True)
                np.testing.assert_allclose(mine, want, rtol=0, atol=1e-12)
                np.testing.assert_allclose(
                    trie.edge_scores(mine, constrained=True), want, atol=1e-12
                )
            else:
                assert np.array_equal(mine, full)
