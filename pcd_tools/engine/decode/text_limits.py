"""A generated string's or list's character and item counts, walked over token bytes.

Counted repetitions in a regular expression (`{0,48}` over a 49k vocabulary) make
outlines-core's index too slow to build, so lengths are enforced by masking tokens while
decoding: `TextLimits` walks each candidate token's bytes from the current state.
"""

from __future__ import annotations

from ...schema.spec import Generation

__all__ = ["LimitState", "TextLimits"]

# (inside a string, after a backslash, characters of the current string, strings opened,
# the list closed)
LimitState = tuple[bool, bool, int, int, bool]


class TextLimits:
    """Counts a JSON string's characters, or a list's items and each item's characters,
    over the bytes of the tokens decoded so far.

    A character is counted at its first byte (an escape such as `\\n` counts once), so a
    value within the limits validates against Pydantic's `min_length` / `max_length`.

    Args:
        gen: The field's generation spec.
    """

    def __init__(self, gen: Generation):
        if gen.type == "string":
            self.chars = (gen.min_length, gen.max_length)
            self.items: tuple[int | None, int | None] = (None, None)
        elif gen.type == "string_list":
            self.chars = (gen.item_min_length, gen.item_max_length)
            self.items = (gen.min_length, gen.max_length)
        else:
            self.chars, self.items = (None, None), (None, None)
        self.active = any(v is not None for v in (*self.chars, *self.items))

    start: LimitState = (False, False, 0, 0, False)

    def step(self, state: LimitState, data: bytes) -> LimitState | None:
        """The state after `data`, or None if it breaks a limit (or leads only to one: a
        list's `,` when it holds its most items)."""
        in_str, esc, chars, items, closed = state
        cmin, cmax = self.chars
        imin, imax = self.items
        for b in data:
            if in_str:
                if esc:
                    esc = False
                    continue
                if b == 0x22:  # the closing quote
                    in_str = False
                    if cmin is not None and chars < cmin:
                        return None
                    continue
                if b == 0x5C:
                    esc = True
                    chars += 1
                elif b & 0xC0 != 0x80:  # not a UTF-8 continuation byte
                    chars += 1
                if cmax is not None and chars > cmax:
                    return None
            elif closed:
                continue
            elif b == 0x22:
                in_str, chars, items = True, 0, items + 1
                if imax is not None and items > imax:
                    return None
            elif b == 0x2C and imax is not None and items >= imax:  # another item would follow
                return None
            elif b == 0x5D:  # the list's `]`
                if imin is not None and items < imin:
                    return None
                closed = True
        return (in_str, esc, chars, items, closed)
