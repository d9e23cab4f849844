"""The regular expression of a generated field's JSON value, for outlines-core's index.

outlines-core turns a regular expression into a token index; this module writes that
expression from a `Generation` so that every constraint is part of the grammar:

- numbers and integers with `ge`/`le`: an exact range expression over the digits (plain
  decimals, no exponent; outlines-core's own JSON-schema compiler drops `minimum` and
  `maximum`);
- dates and date-times: ISO 8601 with the real number of days per month (leap years
  included), so every value also parses as a `date`;
- a string's `pattern`: wrapped in quotes as one group (outlines-core would not group an
  alternation), with `.` and negated classes kept inside JSON string characters.

String lengths and a list's item counts are not written as counted repetitions (an
index over a 49k-token vocabulary for `{0,200}` takes minutes to build): the decoder
counts characters and items as it goes (`generate.TextLimits`). The regexes use the
syntax both Python's `re` and outlines-core's engine read.
"""

from __future__ import annotations

from decimal import Decimal

from ...schema.spec import Generation

__all__ = [
    "STRING_CHAR",
    "decimal_range",
    "field_regex",
    "int_range",
    "json_string_pattern",
    "opener",
    "value_regex",
]

# One character of a JSON string's text (outlines-core's STRING_INNER, without `\uXXXX`).
STRING_CHAR = r'(?:[^"\\\x00-\x1F\x7F-\x9F]|\\["\\/bfnrt])'
STRING = f'"{STRING_CHAR}*"'
# A pattern's `.`: any string character but a newline (written `\n` in JSON).
DOT_CHAR = r'(?:[^"\\\x00-\x1F\x7F-\x9F]|\\["\\/bfrt])'
_FRACTION = r"(?:\.[0-9]+)?"
NUMBER = r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?"
INTEGER = r"(?:0|-?[1-9][0-9]*)"

_YEAR = r"(?:[1-9][0-9]{3}|0[1-9][0-9]{2}|00[1-9][0-9]|000[1-9])"
_LEAP_YEAR = r"(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:0[48]|[2468][048]|[13579][26])00)"
_MONTH_DAY = (
    r"(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])"
    r"|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)"
    r"|02-(?:0[1-9]|1[0-9]|2[0-8]))"
)
DATE = f"(?:{_YEAR}-{_MONTH_DAY}|{_LEAP_YEAR}-02-29)"
TIME = (
    r"(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\.[0-9]{1,6})?"
    r"(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])?"
)


# --- integers ------------------------------------------------------------------------------


def _digits_between(lo: str, hi: str) -> str:
    """Digit strings of one length from `lo` to `hi` (inclusive, `lo <= hi`)."""
    if lo == hi:
        return lo
    n = len(lo)
    if lo[0] == hi[0]:
        return lo[0] + _digits_between(lo[1:], hi[1:])
    rest = n - 1
    if lo[1:] == "0" * rest and hi[1:] == "9" * rest:
        return f"[{lo[0]}-{hi[0]}]" + (f"[0-9]{{{rest}}}" if rest else "")
    alts = [lo[0] + _digits_between(lo[1:], "9" * rest)]
    if int(hi[0]) - int(lo[0]) > 1:
        alts.append(f"[{int(lo[0]) + 1}-{int(hi[0]) - 1}][0-9]{{{rest}}}")
    alts.append(hi[0] + _digits_between("0" * rest, hi[1:]))
    return "(?:" + "|".join(alts) + ")"


def _natural_range(lo: int, hi: int | None) -> str:
    """Non-negative integers from `lo` to `hi` (None: no upper bound), no leading zeros."""
    alts = []
    top = len(str(hi)) if hi is not None else len(str(lo))
    for d in range(len(str(lo)), top + 1):
        a = lo if d == len(str(lo)) else 10 ** (d - 1)
        b = hi if hi is not None and d == len(str(hi)) else 10**d - 1
        if a <= b:
            alts.append(_digits_between(str(a), str(b)))
    if hi is None:
        alts.append(f"[1-9][0-9]{{{len(str(lo))},}}")
    return alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"


def int_range(ge: int | None, le: int | None) -> str:
    """JSON integers `n` with `ge <= n <= le` (None: unbounded on that side).

    Raises:
        ValueError: if the range is empty.
    """
    if ge is not None and le is not None and ge > le:
        raise ValueError(f"empty integer range {ge}..{le}")
    if ge is None and le is None:
        return INTEGER
    alts = []
    if le is None or le >= 0:
        alts.append(_natural_range(max(ge, 0) if ge is not None else 0, le))
    if ge is None or ge < 0:
        low = max(1, -le) if le is not None else 1
        alts.append("-" + _natural_range(low, -ge if ge is not None else None))
    return alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"


# --- decimals ------------------------------------------------------------------------------


def _split(x: Decimal) -> tuple[int, str]:
    """A non-negative decimal's integer part and fraction digits (no trailing zeros)."""
    text = format(x, "f")
    whole, _, frac = text.partition(".")
    return int(whole), frac.rstrip("0")


def _frac_ge(a: str) -> str:
    """Non-empty digit strings D with 0.D >= 0.a (`a` non-empty, no trailing zeros)."""
    c, rest = int(a[0]), a[1:]
    alts = [f"[{c + 1}-9][0-9]*"] if c < 9 else []
    alts.append(str(c) + (_frac_ge(rest) if rest else "[0-9]*"))
    return alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"


def _frac_le(b: str) -> str:
    """Non-empty digit strings D with 0.D <= 0.b (`b` without trailing zeros)."""
    if not b:
        return "0+"
    c, rest = int(b[0]), b[1:]
    alts = [f"[0-{c - 1}][0-9]*"] if c > 0 else []
    alts.append(str(c) + (f"(?:{_frac_le(rest)})?" if rest else "0*"))
    return alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"


def _frac_between(a: str, b: str) -> str:
    """Non-empty digit strings D with 0.a <= 0.D <= 0.b (`a` non-empty, `a <= b`)."""
    ca, cb = int(a[0]), int(b[0])
    ra, rb = a[1:], b[1:]
    if ca == cb:
        if not ra:
            return str(ca) + (f"(?:{_frac_le(rb)})?" if rb else "0*")
        return str(ca) + _frac_between(ra, rb)
    alts = [str(ca) + (_frac_ge(ra) if ra else "[0-9]*")]
    if cb - ca > 1:
        alts.append(f"[{ca + 1}-{cb - 1}][0-9]*")
    alts.append(str(cb) + (f"(?:{_frac_le(rb)})?" if rb else "0*"))
    return "(?:" + "|".join(alts) + ")"


def _magnitudes(lo: Decimal, hi: Decimal | None) -> str:
    """Plain decimals `x` (no sign, optional fraction) with `lo <= x <= hi`."""
    a_int, a_frac = _split(lo)
    at_low = str(a_int) + (r"\." + _frac_ge(a_frac) if a_frac else _FRACTION)
    if hi is None:
        return f"(?:{at_low}|{_natural_range(a_int + 1, None)}{_FRACTION})"
    b_int, b_frac = _split(hi)
    if a_int == b_int:
        if a_frac:
            return str(a_int) + r"\." + _frac_between(a_frac, b_frac)
        return str(a_int) + rf"(?:\.{_frac_le(b_frac)})?"
    alts = [at_low]
    if b_int - a_int > 1:
        alts.append(_natural_range(a_int + 1, b_int - 1) + _FRACTION)
    alts.append(str(b_int) + rf"(?:\.{_frac_le(b_frac)})?")
    return "(?:" + "|".join(alts) + ")"


def decimal_range(ge: float | None, le: float | None) -> str:
    """JSON numbers `x` with `ge <= x <= le`, as plain decimals (no exponent). A bound is
    read as the shortest decimal that prints it (`0.1` is 0.1), and a decimal within the
    bounds parses to a float within them, since rounding to a float is monotonic.

    Raises:
        ValueError: if the range is empty.
    """
    if ge is None and le is None:
        return NUMBER
    lo = Decimal(repr(float(ge) + 0.0)) if ge is not None else None
    hi = Decimal(repr(float(le) + 0.0)) if le is not None else None
    if lo is not None and hi is not None and lo > hi:
        raise ValueError(f"empty number range {ge}..{le}")
    alts = []
    if hi is None or hi >= 0:
        alts.append(_magnitudes(max(lo, Decimal(0)) if lo is not None else Decimal(0), hi))
    if lo is None or lo < 0:
        low = max(Decimal(0), -hi) if hi is not None else Decimal(0)
        alts.append("-" + _magnitudes(low, -lo if lo is not None else None))
    return alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"


# --- strings -------------------------------------------------------------------------------


def json_string_pattern(pattern: str) -> str:
    """A JSON string (with its quotes) whose text matches `pattern` as a whole: anchors
    dropped, the pattern grouped, `.` and negated classes kept to JSON string characters."""
    p = pattern
    if p.startswith("^"):
        p = p[1:]
    if p.endswith("$") and not p.endswith("\\$"):
        p = p[:-1]
    out: list[str] = []
    i = 0
    while i < len(p):
        ch = p[i]
        if ch == "\\":
            out.append(p[i : i + 2])
            i += 2
        elif ch == "[":
            j = i + 1
            negated = j < len(p) and p[j] == "^"
            j += 1 if negated else 0
            if j < len(p) and p[j] == "]":
                j += 1
            while j < len(p) and p[j] != "]":
                j += 2 if p[j] == "\\" else 1
            body = p[i + 1 : j]
            out.append("[" + body + (r'"\\\x00-\x1F\x7F-\x9F' if negated else "") + "]")
            i = j + 1
        elif ch == ".":
            out.append(DOT_CHAR)
            i += 1
        else:
            out.append(ch)
            i += 1
    return '"(?:' + "".join(out) + ')"'


def value_regex(gen: Generation) -> str:
    """The regular expression of a generated value's JSON text (no `null`)."""
    if gen.type == "string":
        return json_string_pattern(gen.pattern) if gen.pattern else STRING
    if gen.type == "number":
        return decimal_range(gen.ge, gen.le)
    if gen.type == "integer":
        return int_range(
            int(gen.ge) if gen.ge is not None else None, int(gen.le) if gen.le is not None else None
        )
    if gen.type == "string_list":
        item = json_string_pattern(gen.pattern) if gen.pattern else STRING
        return rf"\[(?:{item}(?:, {item})*)?\]"
    if gen.type == "date":
        return f'"{DATE}"'
    return f'"{DATE}T{TIME}"'


def opener(gen: Generation, optional: bool) -> str:
    """What every value of the field starts with, written with its key instead of
    decoded: `"` for a string or a date, `[` for a list (nothing when it may be `null`).

    Decoding the opening quote lets a tokenizer's merged tokens (`",` , `" `) stand for
    the quote plus the value's first characters, and a small model takes the `",` it
    knows from closing strings: values then start with a stray `, `. Written with the
    key, the quote is in the prompt and the first decoded token is the value's own.
    """
    if optional:
        return ""
    return (
        "["
        if gen.type == "string_list"
        else '"'
        if gen.type in ("string", "date", "datetime")
        else ""
    )


def field_regex(gen: Generation, optional: bool, terminator: str, opened: bool = False) -> str:
    """A generated field's value (or `null` when optional) followed by `terminator`
    (`,` or `\\n}`), the text its decoding must produce; with `opened`, less its
    `opener` (already written with the key)."""
    value = value_regex(gen)
    if opened and opener(gen, optional):
        value = value[2:] if value.startswith("\\[") else value[1:]
    if optional:
        value = f"(?:{value}|null)"
    term = "".join({"\n": r"\n", "}": r"\}"}.get(c, c) for c in terminator)
    return value + term
