"""JSON text exactly as DSH's JavaScript writer produces it, and a strict reader.

Why not plain ``json.dumps``: a v3 log written here must be byte-comparable with
one written by DSH (``JSON.stringify``), and its reader must refuse what a JS
reader could not represent. The differences that matter:

* compact separators, non-ASCII kept raw (``ensure_ascii=False``);
* lone UTF-16 surrogates are written as ``\\udXXX`` escapes (JS's well-formed
  ``JSON.stringify``), where Python would fail to encode them as UTF-8;
* numbers: JS has one number type, so ``1.0`` is written ``1`` and ``1e-05`` is
  written ``0.00001``. Integral floats are already ints after
  :func:`dsh_host._jsonsafe.to_json_builtins`; the few non-integral floats whose
  Python ``repr`` differs from JS's ``Number#toString`` are patched in after
  encoding, so the common path stays the C encoder;
* reading refuses ``NaN`` / ``Infinity`` (not JSON) and turns integral floats
  (``2.0``) into ints, which is what a JS reader would hand back.
"""

from __future__ import annotations

import json
import os
import re
from decimal import Decimal
from typing import Any, Final

import msgspec

from dsh_host.sdk import MAX_SAFE_INTEGER, parse_js_float

__all__ = ["dumps", "dumps_bytes", "js_number", "loads"]

_SURROGATE: Final = re.compile("[\ud800-\udfff]")
_MAX_SAFE: Final = MAX_SAFE_INTEGER


def js_number(value: float) -> str:
    """``Number.prototype.toString`` for a finite float (ECMA-262 Number::toString)."""
    if value == 0:
        return "0"
    if value.is_integer() and abs(value) <= _MAX_SAFE:
        return str(int(value))
    sign = "-" if value < 0 else ""
    # repr() gives the shortest round-tripping digits, the same digits JS picks.
    digits_t, exponent = Decimal(repr(abs(value))).normalize().as_tuple()[1:]
    digits = "".join(map(str, digits_t))
    k = len(digits)
    n = int(exponent) + k  # value = 0.digits * 10**n
    if k <= n <= 21:
        return sign + digits + "0" * (n - k)
    if 0 < n <= 21:
        return sign + digits[:n] + "." + digits[n:]
    if -6 < n <= 0:
        return sign + "0." + "0" * (-n) + digits
    e = n - 1
    mantissa = digits[0] + ("." + digits[1:] if k > 1 else "")
    return f"{sign}{mantissa}e{'+' if e >= 0 else '-'}{abs(e)}"


def _needs_patch(value: Any) -> bool:
    stack = [value]
    while stack:
        node = stack.pop()
        tp = type(node)
        if tp is float:
            if repr(node) != js_number(node):
                return True
        elif tp is dict:
            stack.extend(node.values())
        elif tp is list or tp is tuple:
            stack.extend(node)
    return False


def _patch_floats(value: Any, table: dict[str, str], nonce: str) -> Any:
    tp = type(value)
    if tp is float and repr(value) != js_number(value):
        token = f"{nonce}{len(table)}"
        table[token] = js_number(value)
        return token
    if tp is dict:
        return {k: _patch_floats(v, table, nonce) for k, v in value.items()}
    if tp is list or tp is tuple:
        return [_patch_floats(v, table, nonce) for v in value]
    return value


def _fix_surrogates(text: str) -> str:
    # Adjacent high+low surrogates form one character in JS; merge them first,
    # then escape whatever is still lone, as JSON.stringify does.
    merged = text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")
    return _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", merged)


def dumps(value: Any) -> str:
    """Compact JSON text of a plain JSON value (dict/list/str/int/float/bool/None)."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    if _needs_patch(value):
        table: dict[str, str] = {}
        nonce = "\x00" + os.urandom(8).hex() + "#"
        text = json.dumps(
            _patch_floats(value, table, nonce),
            ensure_ascii=False,
            separators=(",", ":"),
            allow_nan=False,
        )
        for token, number in table.items():
            text = text.replace(json.dumps(token, ensure_ascii=False), number, 1)
    if _SURROGATE.search(text):
        text = _fix_surrogates(text)
    return text


class _FloatMismatch(Exception):
    """Internal: a number token of the text is not printed the way JS prints it."""


def _check_float(text: str) -> float:
    number = float(text)
    if js_number(number) != text:
        raise _FloatMismatch
    return number


#: One decoder for every check (building one costs more than decoding a typical line).
_FLOAT_CHECKER: Final = msgspec.json.Decoder(float_hook=_check_float)


def floats_match_javascript(encoded: bytes) -> bool:
    """True when every number token of ``encoded`` is printed the way JS would print it.

    False too when msgspec cannot parse ``encoded`` at all (an escaped lone
    surrogate, which :func:`~dsh_host._session.events.encode_event` writes as JS
    does): the caller then takes the exact slow path.
    """
    try:
        _FLOAT_CHECKER.decode(encoded)
    except (_FloatMismatch, msgspec.DecodeError):
        # a float JS prints differently, or e.g. an escaped lone surrogate: let the exact
        # path decide
        return False
    return True


def dumps_bytes(value: Any) -> bytes:
    """:func:`dumps` encoded as UTF-8.

    Fast path: msgspec's compact encoding already is JS's text for strings,
    ints, arrays and objects; it is used unless a float token would print
    differently or a lone surrogate is present (then the exact slow path).
    """
    try:
        encoded = msgspec.json.encode(value)
    except (UnicodeEncodeError, TypeError, OverflowError):
        return dumps(value).encode("utf-8")
    if floats_match_javascript(encoded):
        return encoded
    return dumps(value).encode("utf-8")


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _parse_int_keep_negative_zero(text: str) -> Any:
    return -0.0 if text == "-0" else int(text)


def loads(data: bytes | str, *, keep_negative_zero: bool = False) -> Any:
    """Parse one JSON text strictly (UTF-8, no NaN/Infinity); raises ``ValueError`` (also for
    nesting deeper than the parser recurses).

    ``keep_negative_zero`` reads ``-0`` as ``-0.0`` (JS ``JSON.parse`` keeps the
    sign), so header checks can refuse it as DSH does; elsewhere ``-0`` is 0.

    The stdlib parser is the reference; msgspec (several times faster) is tried
    first and its value used only when it accepts the text, where it gives the
    same value: the same float hook, ints of any size exact, ``-0`` as 0,
    duplicate keys last-wins at the first key's position. Everything msgspec
    refuses (escaped lone surrogates, which JS writers emit; invalid UTF-8; bad
    syntax; a float overflowing to infinity; nesting past its depth limit) is
    redone by the stdlib parser, so its verdict and error are the reference's.
    """
    if not keep_negative_zero:
        try:
            return _FAST_DECODER.decode(data)
        except (ValueError, RecursionError):  # msgspec.DecodeError is a ValueError
            pass
    text = data.decode("utf-8") if isinstance(data, bytes | bytearray | memoryview) else data
    try:
        if keep_negative_zero:
            return json.loads(
                text,
                parse_constant=_reject_constant,
                parse_float=parse_js_float,
                parse_int=_parse_int_keep_negative_zero,
            )
        return json.loads(text, parse_constant=_reject_constant, parse_float=parse_js_float)
    except RecursionError:  # a line nested deeper than the parser recurses is refused, typed
        raise ValueError("JSON text nested too deep to parse") from None


_FAST_DECODER: Final = msgspec.json.Decoder(float_hook=parse_js_float)
