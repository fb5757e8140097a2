"""A walk over msgpack headers that refuses a hostile shape before msgpack allocates anything for it.

msgpack's C unpacker preallocates every container it is told about: 5 KB of nested `array 32` headers, each
declaring 131,072 elements, cost 46 ms of CPU and 80 MB before the input was found to be short. This walk reads only
the headers (strings and binaries are skipped by their length) and refuses, with `malformed`:

- nesting deeper than `max_depth`;
- a container that declares more elements than there are bytes left (every element takes at least one byte), and
  more declared elements in all than the message has bytes: what msgpack will then allocate is linear in the input;
- extension types, the reserved byte 0xc1, truncation, and bytes after the one top-level value.

It costs one step per element, and each element takes at least one byte of input: garbage and bombs alike cost
microseconds per kilobyte.
"""

from __future__ import annotations

from transports.wire.reasons import Reason, Rejected

# Per header byte: _STEP is the whole length of a value that is the header plus fixed payload (fixints, nil,
# booleans, fixstr, floats and sized ints: one lookup and one add, the hot path), else 0. For the rest, _WIDTH is
# the number of length or count bytes after the header (0 for fix-containers, whose count is in the header), _PER
# the elements per counted entry (maps hold key and value; 0 marks str/bin), and _BAD the bytes never used.
_STEP = bytearray(256)
_WIDTH = bytearray(256)
_PER = bytearray(256)
_BAD = bytearray(256)
for _b in range(256):
    if _b <= 0x7F or _b >= 0xE0 or _b in (0xC0, 0xC2, 0xC3):
        _STEP[_b] = 1
    elif _b <= 0x8F:
        _PER[_b] = 2
    elif _b <= 0x9F:
        _PER[_b] = 1
    elif _b <= 0xBF:
        _STEP[_b] = 1 + (_b & 0x1F)
    elif _b in (0xC4, 0xD9, 0xC5, 0xDA, 0xC6, 0xDB):  # bin8 str8 bin16 str16 bin32 str32
        _WIDTH[_b] = {0xC4: 1, 0xD9: 1, 0xC5: 2, 0xDA: 2, 0xC6: 4, 0xDB: 4}[_b]
    elif _b in (0xCC, 0xD0, 0xCD, 0xD1, 0xCA, 0xCE, 0xD2, 0xCB, 0xCF, 0xD3):
        _STEP[_b] = 1 + {0xCC: 1, 0xD0: 1, 0xCD: 2, 0xD1: 2, 0xCA: 4, 0xCE: 4, 0xD2: 4}.get(_b, 8)
    elif _b in (0xDC, 0xDE, 0xDD, 0xDF):  # array16 map16 array32 map32
        _WIDTH[_b] = 2 if _b in (0xDC, 0xDE) else 4
        _PER[_b] = 1 if _b in (0xDC, 0xDD) else 2
    else:  # 0xc1, and the extension types 0xc7-0xc9, 0xd4-0xd8
        _BAD[_b] = 1


def _bad(why: str) -> Rejected:
    return Rejected(Reason.MALFORMED, f"not msgpack we take: {why}")


def check_shape(data: bytes, *, max_depth: int) -> None:
    """Raise `Rejected(malformed)` unless `data` is exactly one msgpack value of a shape we are willing to decode."""
    steps, widths, per = _STEP, _WIDTH, _PER
    end = len(data)
    pos = 0
    declared = 0
    left = 1  # elements still to read at the current level; the top level holds exactly one value
    outer: list[int] = []  # what was left at each enclosing level
    try:
        while True:
            if not left:
                if not outer:
                    break
                left = outer.pop()
                continue
            left -= 1
            b = data[pos]  # IndexError past the end: truncated
            step = steps[b]
            if step:
                pos += step
                continue
            width = widths[b]
            each = per[b]
            if not each:
                if not width:
                    raise _bad("extension types are not used" if b != 0xC1 else "reserved byte 0xc1")
                if pos + 1 + width > end:
                    raise _bad("it ends in the middle of a header")
                pos += 1 + width + int.from_bytes(data[pos + 1 : pos + 1 + width], "big")
                continue
            if width:
                if pos + 1 + width > end:
                    raise _bad("it ends in the middle of a header")
                count = int.from_bytes(data[pos + 1 : pos + 1 + width], "big") * each
            else:
                count = (b & 0x0F) * each
            pos += 1 + width
            if count > end - pos:
                raise _bad(f"a container declares {count} elements with {end - pos} bytes left")
            declared += count
            if declared > end:
                raise _bad("it declares more elements than it has bytes")
            if count:
                if len(outer) >= max_depth:
                    raise _bad(f"it nests deeper than {max_depth} levels")
                outer.append(left)
                left = count
    except IndexError:
        raise _bad("it ends in the middle of a value") from None
    if pos != end:
        raise _bad("it ends in the middle of a value" if pos > end else "there are bytes after the value")
