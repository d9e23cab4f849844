"""`DecideOptions`: a decision call's options, checked once.

`Decider.decide`, `decide_many`, `adecide` and `adecide_many` take the same options, as
keywords or as a `DecideOptions` (`options=`), and build one checked, frozen object from
them; the orchestrators (`decide.scored`, `decide.generated`) and the async queue read
that object. `check_options` also compiles the schema and applies the call's examples.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypedDict

from ..errors import InvalidArgumentError
from ..schema import Schema, compile_schema, with_examples
from .checks import (
    check_calibration,
    check_max_new_tokens,
    check_pruning,
    check_scoring,
    check_temperature,
)
from .orders import check_orders

if TYPE_CHECKING:
    from ..engine.passes.prune import PruneMode
    from ..engine.scorer import PassMode
    from .checks import LabelFree, Scoring

__all__ = ["DecideKwargs", "DecideOptions", "check_options"]


@dataclass(frozen=True)
class DecideOptions:
    """The options of a decision call, checked when built.

    Pass one as `options=` to `Decider.decide` / `decide_many` / `adecide` /
    `adecide_many` to reuse it across calls; keywords given beside it override its fields.

    Attributes:
        temperature: Softmax temperature (> 0); changes confidence, never the answer.
        scoring: `"full"` (model probability of each candidate given that it answers with
            one), `"constrained"` (renormalised at each trie node), `"pmi"`
            (domain-conditional PMI: the full log-probability minus that with an empty
            context) or `"auto"` (the default): full, except a single-choice field of over
            `AUTO_NODES` trie positions, scored constrained so that certified pruning can
            skip most of it (`FieldResult.scoring` says which; see
            `pcd_tools.decide.methods.Method.resolve`).
        mode: `"packed"`, `"batched"` or `"sequential"`; None is the engine's fastest
            exact one.
        choice_order: Per-field order (indices) in which allowed values are listed,
            stored as `(field, indices)` pairs; `order` gives it as a dict.
        orders: Average each field's distribution over this many evenly spaced rotations
            of its listing, to reduce the model's lean towards values listed early or
            late. Costs `orders` times the prefill and fields pass (each rotation's schema
            prefix is cached). The decision reports `orders` and each field's `flip_rate`.
        allow_empty: Decide on an empty or whitespace-only context instead of raising.
        calibration: The label-free calibration of this call: `"contextual"`, `"none"`,
            `"auto"`, or None for the decider's own (`Decider.with_calibration`).
            `"auto"` chooses raw, PMI or contextual calibration by leave-one-out over the
            schema's examples, once per schema (cached on the decider), and never one
            that loses to raw on them (`pcd_tools.decide.loo`); without examples or with
            a fitted calibration it keeps the decider's own. It takes scoring `"auto"` or
            `"full"` and no `pruning="on"`.
        pruning: `"auto"` scores a field with a large candidate trie (over `AUTO_NODES`
            positions, e.g. hundreds of multi-token codes) by certified pruned search, and
            every other field whole; `"on"` prunes every field that can be; `"off"` scores
            every field whole. A field's own `json_schema_extra={"pruning": ...}` wins over
            `"auto"`. A pruned field reports `certified`, `probability_bounds` and
            `unscored_mass` (see `pcd_tools.engine.passes.prune`).
        max_new_tokens: The token limit of each generated field (`str`, `float`, ...) that
            sets none itself; None for 256 (see `pcd_tools.decide.generated`).

    Raises:
        InvalidArgumentError: for a bad temperature, scoring, calibration, `orders`,
            `pruning` or `max_new_tokens`, `orders > 1` with a `choice_order`,
            `pruning="on"` with `orders > 1` or `scoring="pmi"`, or `calibration="auto"`
            with scoring `"constrained"` or `"pmi"` or `pruning="on"`.
    """

    temperature: float = 1.0
    scoring: Scoring = "auto"
    mode: PassMode | None = None
    choice_order: tuple[tuple[str, tuple[int, ...]], ...] | None = None
    orders: int = 1
    allow_empty: bool = False
    calibration: LabelFree | None = None
    pruning: PruneMode = "auto"
    max_new_tokens: int | None = None

    def __post_init__(self) -> None:
        k = check_orders(self.orders)
        order = _frozen_order(self.choice_order)
        if k > 1 and order:
            raise InvalidArgumentError(
                "choice_order and orders > 1 cannot be combined: orders=k lists the values "
                "in k rotations of the declared order; pass one or the other."
            )
        scoring = check_scoring(self.scoring)
        checked = {
            "temperature": check_temperature(self.temperature),
            "scoring": scoring,
            "choice_order": order,
            "orders": k,
            "allow_empty": bool(self.allow_empty),
            "calibration": check_calibration(self.calibration, scoring, str(self.pruning)),
            "pruning": check_pruning(self.pruning, k, scoring),
            "max_new_tokens": check_max_new_tokens(self.max_new_tokens),
        }
        for name, value in checked.items():
            object.__setattr__(self, name, value)

    @classmethod
    def build(cls, options: DecideOptions | None = None, **overrides: Any) -> DecideOptions:
        """`options` (or the defaults) with `overrides` applied, checked.

        Raises:
            InvalidArgumentError: for an unknown option name (listing the accepted ones)
                or a bad value.
        """
        if options is not None and not isinstance(options, DecideOptions):
            raise InvalidArgumentError(
                f"options must be a DecideOptions or None; got {type(options).__name__}."
            )
        unknown = sorted(set(overrides) - set(OPTION_NAMES))
        if unknown:
            raise InvalidArgumentError(
                f"unknown decision option(s) {', '.join(map(repr, unknown))}; accepted: "
                f"{', '.join(OPTION_NAMES)} (and examples)."
            )
        if options is None:
            return cls(**overrides)
        return dataclasses.replace(options, **overrides) if overrides else options

    @property
    def order(self) -> dict[str, Sequence[int]] | None:
        """`choice_order` as a dict of index lists, or None."""
        if not self.choice_order:
            return None
        return {name: list(idx) for name, idx in self.choice_order}


OPTION_NAMES = tuple(f.name for f in dataclasses.fields(DecideOptions))


class DecideKwargs(TypedDict, total=False):
    """The keyword options of the decision calls: `DecideOptions`'s fields and `examples`.

    `examples` are few-shot examples for this call, replacing the schema's own (`[]` for
    none; None keeps them): `(text, answer)` or `{"input": text, "output": answer}`, the
    answer a dict of the fields or a model instance (see `pcd_tools.schema.examples`). They
    are earlier turns in the cached schema part of the prompt.
    """

    temperature: float
    scoring: Scoring
    mode: PassMode | None
    choice_order: Mapping[str, Sequence[int]] | None
    orders: int
    allow_empty: bool
    calibration: LabelFree | None
    pruning: PruneMode
    max_new_tokens: int | None
    examples: Sequence[Any] | None


def check_options(
    schema: Any, options: DecideOptions | None = None, **kwargs: Any
) -> tuple[Schema, DecideOptions]:
    """Compiles the schema (with the call's `examples`) and checks the call's options.

    Args:
        schema: Any accepted schema form.
        options: Options to start from, or None for the defaults.
        **kwargs: `DecideKwargs`: option overrides, and `examples`.

    Returns:
        The compiled schema and the checked options.

    Raises:
        SchemaError: if the schema is invalid.
        InvalidExampleError: if an example does not fit the schema.
        InvalidArgumentError: for an unknown option or a bad value (see `DecideOptions`).
    """
    examples = kwargs.pop("examples", None)
    checked = DecideOptions.build(options, **kwargs)
    compiled = compile_schema(schema)
    if examples is not None:
        compiled = with_examples(compiled, examples)
    return compiled, checked


def _frozen_order(order: Any) -> tuple[tuple[str, tuple[int, ...]], ...] | None:
    """A `choice_order` (mapping or pairs) as `(field, indices)` pairs, or None."""
    if not order:
        return None
    items = order.items() if isinstance(order, Mapping) else order
    try:
        pairs = tuple((str(name), tuple(idx)) for name, idx in items)
    except (TypeError, ValueError) as e:
        raise InvalidArgumentError(
            "choice_order must map field names to sequences of value indices, e.g. "
            f"{{'priority': [2, 0, 1]}}; got {order!r} ({e})."
        ) from None
    return pairs
