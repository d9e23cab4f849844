"""The numpy attention and SwiGLU kernels against float64 math and MLX's own ops."""

from __future__ import annotations

import numpy as np
import pytest

from pcd_tools.engine import cpu_kernels as K
from pcd_tools.engine.platform import import_mlx
from tests.conftest import make_tiny_model, tiny_decider

mx = import_mlx()
pytestmark = pytest.mark.engine


@pytest.fixture(scope="module", autouse=True)
def installed():
    assert K.install(make_tiny_model(0))  # fills the table of original functions


def reference(q, k, v, scale, mask):
    """Grouped-query attention in float64; mask: None, 'causal', bool or additive."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    b, h, lq, d = q.shape
    kh, s = k.shape[1], k.shape[2]
    sc = np.einsum("bkgld,bksd->bkgls", q.reshape(b, kh, h // kh, lq, d) * scale, k)
    if isinstance(mask, str):
        allowed = np.arange(s - lq, s)[:, None] >= np.arange(s)[None, :]
        sc = np.where(allowed, sc, -np.inf)
    elif mask is not None:
        m = np.asarray(mask)
        m = m.reshape(m.shape[0] if m.ndim > 2 else 1, 1, 1, lq, s)
        sc = np.where(m, sc, -np.inf) if m.dtype == np.bool_ else sc + m
    sc -= sc.max(-1, keepdims=True)
    p = np.exp(sc)
    p /= p.sum(-1, keepdims=True)
    return np.einsum("bkgls,bksd->bkgld", p, v).reshape(b, h, lq, d)


def _qkv(rng, b, h, kh, lq, s, d=32, mag=3.0):
    f = np.float32
    return (
        mx.array((rng.normal(size=(b, h, lq, d)) * mag).astype(f)),
        mx.array(rng.normal(size=(b, kh, s, d)).astype(f)),
        mx.array(rng.normal(size=(b, kh, s, d)).astype(f)),
    )


def _masks(rng, b, lq, s):
    keep = rng.random((b, 1, lq, s)) > 0.4
    keep[..., 0] = True  # no row is fully masked
    additive = np.where(keep, 0.0, -1e9).astype(np.float32)
    return {
        "none": None,
        "causal": "causal",
        "bool": mx.array(keep),
        "bool-2d": mx.array(keep[0, 0]),
        "additive": mx.array(additive),
    }


@pytest.mark.parametrize("kind", ["none", "causal", "bool", "bool-2d", "additive"])
@pytest.mark.parametrize("b,h,kh,lq,s", [(1, 9, 3, 40, 300), (2, 4, 4, 33, 257)])
def test_sdpa_matches_float64_and_mlx(kind, b, h, kh, lq, s):
    rng = np.random.default_rng(lq + s)
    q, k, v = _qkv(rng, b, h, kh, lq, s)
    mask = _masks(rng, b, lq, s)[kind]
    assert b * h * lq * s >= K.MIN_SCORES  # the numpy path runs
    with K.active(True):
        got = np.asarray(K.sdpa(q, k, v, None, 0.2, mask))
    want = reference(q, k, v, 0.2, mask)
    mlx = np.asarray(mx.fast.scaled_dot_product_attention(q, k, v, scale=0.2, mask=mask))
    np.testing.assert_allclose(got, want, atol=2e-5)
    # no less accurate than MLX's own kernel
    assert np.abs(got - want).max() <= max(2 * np.abs(mlx - want).max(), 1e-6)


def test_mask_objects_are_converted_per_object_not_per_address():
    rng = np.random.default_rng(1)
    q, k, v = _qkv(rng, 1, 9, 3, 40, 300)
    with K.active(True):
        for _ in range(3):  # new mask objects may reuse a freed object's id
            keep = rng.random((1, 1, 40, 300)) > 0.5
            keep[..., 0] = True
            mask = mx.array(keep)
            got = np.asarray(K.sdpa(q, k, v, None, 0.2, mask))
            np.testing.assert_allclose(got, reference(q, k, v, 0.2, mask), atol=2e-5)
            del mask


def test_inactive_or_small_calls_use_mlx_itself():
    rng = np.random.default_rng(2)
    q, k, v = _qkv(rng, 1, 9, 3, 40, 300)
    want = np.asarray(mx.fast.scaled_dot_product_attention(q, k, v, scale=0.2, mask="causal"))
    got = np.asarray(K.sdpa(q, k, v, None, 0.2, "causal"))  # not active: the original
    assert np.array_equal(got, want)
    q1 = q[:, :, -1:]
    want1 = np.asarray(mx.fast.scaled_dot_product_attention(q1, k, v, scale=0.2, mask=None))
    with K.active(True):  # a decode step is below MIN_SCORES
        assert np.array_equal(np.asarray(K.sdpa(q1, k, v, None, 0.2, None)), want1)


def test_swiglu_matches_silu_times_x():
    rng = np.random.default_rng(3)
    g = mx.array((rng.normal(size=(1, 64, 1024)) * 4).astype(np.float32))
    x = mx.array(rng.normal(size=(1, 64, 1024)).astype(np.float32))
    gd, xd = np.asarray(g, dtype=np.float64), np.asarray(x, dtype=np.float64)
    want = gd / (1 + np.exp(-gd)) * xd
    with K.active(True):
        got = np.asarray(K.swiglu(g, x))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert np.abs(np.asarray(g)).max() > 8  # the test covers saturated gates


def test_install_is_idempotent_and_leaves_other_callers_alone():
    from mlx_lm.models import llama

    model = make_tiny_model(1)
    assert K.install(model) and K.install(model)
    assert llama.scaled_dot_product_attention is K.sdpa
    assert llama.swiglu is K.swiglu
    assert not getattr(K._state, "on", False)  # off unless a PCD engine turns it on


def test_engine_switch(monkeypatch):
    assert tiny_decider(0).engine.cpu_kernels is True
    assert tiny_decider(0, cpu_kernels=False).engine.cpu_kernels is False
    monkeypatch.setenv("PCD_CPU_KERNELS", "0")
    assert tiny_decider(0).engine.cpu_kernels is False


def test_decisions_agree_with_and_without_kernels(tiny):
    schema = {
        "team": {"type": "enum", "choices": ["billing", "bill_disputes", "tech", "sales"]},
        "urgent": {"type": "boolean"},
    }
    ctx = "My card was charged twice for the same order and I need a refund. " * 6
    K._masks().clear()
    on = tiny.decide(schema, ctx)
    assert K._masks(), "the prefill did not go through the numpy attention"
    tiny.engine.cpu_kernels = False
    try:
        off = tiny.decide(schema, ctx)
    finally:
        tiny.engine.cpu_kernels = True
    for name in on.fields:
        a, b = on.fields[name].distribution, off.fields[name].distribution
        assert max(abs(a[c] - b[c]) for c in a) < 1e-4
