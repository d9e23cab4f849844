"""`DecideOptions`: one checked, frozen options object for every decision call."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Literal

import pytest
from pydantic import BaseModel

from pcd_tools.decide.options import OPTION_NAMES, DecideOptions, check_options
from pcd_tools.errors import InvalidArgumentError

pytestmark = pytest.mark.unit


class Ticket(BaseModel):
    priority: Literal["low", "medium", "high"]
    urgent: bool


def test_defaults_are_the_documented_ones():
    o = DecideOptions()
    assert (o.temperature, o.scoring, o.mode, o.orders, o.pruning) == (1.0, "auto", None, 1, "auto")
    assert (o.allow_empty, o.calibration, o.max_new_tokens, o.order) == (False, None, None, None)


def test_auto_calibration_is_a_typed_option():
    assert DecideOptions(calibration="auto").calibration == "auto"
    assert DecideOptions(calibration="auto", scoring="full").scoring == "full"
    assert (
        DecideOptions.build(DecideOptions(calibration="auto"), calibration=None).calibration is None
    )


def test_options_are_frozen_hashable_and_normalised():
    a = DecideOptions(temperature=1, choice_order={"priority": [2, 0, 1]})
    b = DecideOptions(temperature=1.0, choice_order={"priority": (2, 0, 1)})
    assert a == b and hash(a) == hash(b)
    assert isinstance(a.temperature, float)
    assert a.choice_order == (("priority", (2, 0, 1)),)
    assert a.order == {"priority": [2, 0, 1]}
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.temperature = 2.0  # type: ignore[misc]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"temperature": 0}, "temperature must be finite and > 0"),
        ({"temperature": True}, "temperature must be a number"),
        ({"scoring": "greedy"}, "accepted: 'auto', 'full', 'constrained', 'pmi'"),
        ({"orders": 0}, "orders"),
        ({"calibration": "platt"}, "unknown calibration 'platt'"),
        ({"calibration": "AUTO"}, "or 'auto'"),
        ({"calibration": "auto", "scoring": "pmi"}, "calibration='auto' with scoring='pmi'"),
        ({"calibration": "auto", "scoring": "constrained"}, "accepted: scoring 'auto' or 'full'"),
        ({"calibration": "auto", "pruning": "on"}, "calibration='auto' with pruning='on'"),
        ({"pruning": "maybe"}, "pruning='maybe'; accepted"),
        ({"pruning": "on", "orders": 2}, "pruning='on' cannot be combined with orders=2"),
        ({"max_new_tokens": 0}, "max_new_tokens must be an int >= 1"),
        ({"orders": 2, "choice_order": {"priority": [0, 1, 2]}}, "cannot be combined"),
        ({"choice_order": {"priority": 3}}, "choice_order must map field names"),
    ],
)
def test_bad_values_are_refused_when_built(kwargs, message):
    with pytest.raises(InvalidArgumentError, match=message):
        DecideOptions(**kwargs)
    with pytest.raises(InvalidArgumentError, match=message):  # the same through a call
        check_options(Ticket, **kwargs)


def test_build_overrides_fields_and_rechecks():
    base = DecideOptions(temperature=0.5, scoring="full")
    o = DecideOptions.build(base, orders=3)
    assert (o.temperature, o.scoring, o.orders) == (0.5, "full", 3)
    assert DecideOptions.build(base) is base
    with pytest.raises(InvalidArgumentError, match="temperature"):
        DecideOptions.build(base, temperature=-1.0)


def test_unknown_option_names_the_accepted_ones():
    with pytest.raises(InvalidArgumentError, match=r"unknown decision option.*'temprature'") as e:
        DecideOptions.build(temprature=0.5)
    for name in OPTION_NAMES:
        assert name in str(e.value)
    with pytest.raises(InvalidArgumentError, match="options must be a DecideOptions"):
        DecideOptions.build({"temperature": 0.5})  # type: ignore[arg-type]


def test_check_options_applies_examples_to_the_schema_only():
    compiled, o = check_options(
        Ticket, temperature=0.7, examples=[("Down!", {"priority": "high", "urgent": True})]
    )
    assert len(compiled.examples) == 1 and o.temperature == 0.7
    assert "examples" not in OPTION_NAMES


def test_decider_calls_take_options_or_keywords_alike(tiny):
    opts = DecideOptions(temperature=0.5, scoring="constrained")
    ctx = "The checkout page is down for every customer."
    by_kw = tiny.decide(Ticket, ctx, temperature=0.5, scoring="constrained")
    by_obj = tiny.decide(Ticket, ctx, options=opts)
    mixed = tiny.decide(Ticket, ctx, options=DecideOptions(scoring="constrained"), temperature=0.5)
    for d in (by_obj, mixed):
        assert d.temperature == 0.5 and d.scoring == "constrained"
        for name, f in by_kw.fields.items():  # (a prefix-cache hit may differ by ~1e-9)
            assert d.fields[name].distribution == pytest.approx(f.distribution, abs=1e-6)
    other = tiny.decide(Ticket, ctx, options=opts, temperature=2.0)
    assert other.fields["priority"].distribution != pytest.approx(
        by_kw.fields["priority"].distribution, abs=1e-3
    )
    with pytest.raises(InvalidArgumentError, match=r"unknown decision option.*'batch_size'"):
        asyncio.run(tiny.adecide_many(Ticket, [ctx], batch_size=4))  # type: ignore[call-arg]
    many = asyncio.run(tiny.adecide_many(Ticket, [ctx, ctx], options=opts))
    for d in many:
        assert d.fields["priority"].distribution == pytest.approx(
            by_kw.fields["priority"].distribution, abs=1e-6
        )


def test_the_keyword_type_lists_every_option_and_examples():
    from pcd_tools.decide.options import DecideKwargs

    assert set(DecideKwargs.__annotations__) == {*OPTION_NAMES, "examples"}
