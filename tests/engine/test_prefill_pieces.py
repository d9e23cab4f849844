"""A long row's prefill in pieces (`Passes.prefill_pieces`): bounded calls, the numbers of
one call, the pieces' K/V read in place by the attention kernel."""

from __future__ import annotations

from typing import Literal

import numpy as np
import pytest
from pydantic import BaseModel, Field

from pcd_tools.engine.host.blas import import_mlx
from pcd_tools.engine.kernels import cpu_ops
from pcd_tools.engine.passes import pass_cache
from pcd_tools.engine.passes.kv_parts import kv_parts
from tests.conftest import tiny_decider

pytestmark = pytest.mark.engine

mx = import_mlx()


class Route(BaseModel):
    """Route the thread."""

    urgent: bool = Field(description="Does it need a reply today?")
    team: Literal["billing", "infra", "sales", "legal"] = Field(description="Owner")


THREAD = " ".join(f"[{i}] The invoice page returns 502 for account {i * 37}." for i in range(40))


def _decisions(monkeypatch, piece: int) -> list[dict[str, list[float]]]:
    """Each field's probabilities, cold then warm, with prefill pieces of `piece` tokens."""
    monkeypatch.setattr(pass_cache, "PIECE_TOKENS", piece)
    d = tiny_decider(0)
    out = []
    for ctx in (THREAD, THREAD + " Any update?"):  # cold (whole prompt), then warm
        got = d.decide(Route, ctx)
        out.append({n: list(f.distribution.values()) for n, f in got.fields.items()})
    return out


def test_pieces_give_the_numbers_of_one_call(monkeypatch):
    """Cold and warm decisions on a 2,000-token thread in pieces of 256 tokens equal the
    same decisions in one call (float32: probabilities to 1e-5)."""
    whole = _decisions(monkeypatch, 10**9)
    pieces = _decisions(monkeypatch, 256)
    for a, b in zip(whole, pieces):
        for name in a:
            np.testing.assert_allclose(b[name], a[name], atol=1e-5)


def test_pieces_are_bounded_and_read_in_place(monkeypatch):
    """Every prefill call holds at most a piece's tokens; the attention gets the pieces
    as parts (none joined into a copy), within the kernel's MAX_PARTS; the K/V that come
    back are the prompt's, laid out as one call's; and the schema part cached from a
    cold prompt is sliced from the first piece."""
    monkeypatch.setattr(pass_cache, "PIECE_TOKENS", 256)
    d = tiny_decider(0)
    passes = d.engine.passes
    calls: list[int] = []
    parts: list[int] = []
    run, sdpa = passes.run, cpu_ops._native_sdpa

    def counted_run(tokens, caches):
        calls.append(int(tokens.shape[1]))
        return run(tokens, caches)

    def counted_sdpa(lib, q, k, v, scale, mask, prefix=()):
        parts.append(len(prefix) + 1)
        return sdpa(lib, q, k, v, scale, mask, prefix)

    monkeypatch.setattr(passes, "run", counted_run)
    monkeypatch.setattr(cpu_ops, "_native_sdpa", counted_sdpa)
    row = list(d.engine.encode_ids(THREAD))
    with d.engine.kernels():
        kv, logits = passes.prefill_with_logits([row], None)
    assert len(row) > 1500 and max(calls) <= 256 and sum(calls) == len(row)
    assert 1 < max(parts) <= cpu_ops.MAX_PARTS
    k0, v0 = kv[0]
    assert k0.shape[2] == len(row) and len(kv_parts(k0, v0)) == len(calls)
    monkeypatch.setattr(pass_cache, "PIECE_TOKENS", 10**9)
    with d.engine.kernels():
        one_kv, one_logits = passes.prefill_with_logits([row], None)
    np.testing.assert_allclose(np.asarray(k0), np.asarray(one_kv[0][0]), atol=1e-5)
    np.testing.assert_allclose(logits, one_logits, atol=1e-4)
    monkeypatch.setattr(pass_cache, "PIECE_TOKENS", 256)
    d.engine.clear_cache()
    d.decide(Route, THREAD)  # cold: the schema part goes to the prefix cache
    (head,) = [key for key in d.engine.prefix_cache._entries]
    k, _ = d.engine.prefix_cache.get(head)[0]
    assert k.shape[2] == len(head)


@pytest.mark.parametrize("n", [1, 1024, 1025, 8192, 12_289, 131_072])
def test_piece_size_keeps_the_parts_within_the_kernel(n):
    size = pass_cache.piece_tokens(n)
    assert size >= pass_cache.PIECE_TOKENS
    head_pieces = (n - 1) // size
    # the cached prefix, the pieces, the row's own call, a fields chunk and a kept stem
    assert 1 + head_pieces + 1 + 1 + 1 <= cpu_ops.MAX_PARTS


@pytest.mark.parametrize("option", ["pack_budget", "batch_tokens"])
@pytest.mark.parametrize("value", [0, -3, 2.5, True, "256"])
def test_the_engines_token_budgets_are_checked(option, value):
    """A budget of tokens per pass must be a whole number, at least 1: 0 divided by zero
    deep in the packing, a float or a string failed later still."""
    from pcd_tools.errors import InvalidArgumentError

    with pytest.raises(InvalidArgumentError, match=rf"{option}=.*at least 1"):
        tiny_decider(0, **{option: value})
    assert tiny_decider(0, **{option: 1}).engine is not None
