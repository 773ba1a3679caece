"""``coerce_event_data``'s typed fast path decides exactly as the general path.

Appending the registered Struct of an event type takes a fast path (a msgspec round trip plus
a scan of the open-valued fields); anything else (plain JSON, or a Struct the fast path doubts)
takes the general path (lossless-JSON walk, then conversion). The two must never differ: the
same Struct and its plain JSON twin give the same stored value (same types all the way down),
or the same error, message included. The payloads are generated with values at every edge the
fast path must notice: unsafe integers, NaN, infinities, ``-0.0``, integral floats, non-string
keys, lone surrogates, values JSON cannot carry, out-of-range fields, mismatched tool ids.
"""

from __future__ import annotations

import decimal
import math
from types import MappingProxyType
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsh_host._session import (
    AssistantMessage,
    AssistantMessageData,
    CompletedReason,
    ErrorReason,
    LlmFailure,
    LlmRetryData,
    ModelSource,
    PluginSource,
    TextBlock,
    TokenUsage,
    ToolResultBlock,
    ToolResultData,
    ToolResultMessage,
    ToolSource,
    TurnEnd,
    UserMessage,
    UserSource,
    coerce_event_data,
)
from dsh_host._session.errors import InvalidSessionEventError

_SAFE = 2**53 - 1

_plain_texts = st.text(max_size=8)
_texts = st.one_of(
    _plain_texts,
    _plain_texts,
    _plain_texts,
    st.text(
        st.characters(min_codepoint=0xD7F0, max_codepoint=0xE010, exclude_categories=()),
        max_size=3,
    ),
)
_good_ints = st.integers(1, 5) | st.integers(1, _SAFE)
_ints = st.one_of(
    _good_ints,
    _good_ints,
    _good_ints,
    st.integers() | st.sampled_from([0, -1, _SAFE + 1, -_SAFE - 1, 2**64]),
)
_valid_leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**53) + 1, 2**53 - 1),
    st.floats(allow_nan=False, allow_infinity=False).filter(lambda f: f != 0 or f.hex()[0] != "-"),
    st.text(max_size=6),
)
_flawed_leaves = st.sampled_from(
    [float("nan"), float("inf"), -0.0, _SAFE + 1, -_SAFE - 1, b"x", {1}, "\ud800"]
) | st.just(decimal.Decimal(1))
#: mostly valid (so payloads get past the fast path's checks), with a flaw now and then
_leaves = st.one_of(
    _valid_leaves, _valid_leaves, _valid_leaves, _valid_leaves, _valid_leaves, _flawed_leaves
)
_open = st.recursive(
    _leaves,
    lambda inner: st.lists(inner, max_size=3)
    | st.lists(inner, max_size=3).map(tuple)
    | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    | st.dictionaries(st.text(max_size=3), inner, max_size=2).map(MappingProxyType)
    | st.dictionaries(st.integers(0, 2), inner, min_size=1, max_size=2),
    max_leaves=6,
)
_maybe = st.just(msgspec.UNSET)

_failures = st.builds(
    LlmFailure,
    message=_texts,
    code=st.sampled_from(["SERVER", "RATE_LIMIT", "SERVER", ""]),
    status=_maybe | _ints,
    provider_retry_after_ms=_maybe | _ints,
)
_tool_results = st.builds(
    lambda turn, step, call_id, answered, text, meta, extra: ToolResultData(
        turn=turn,
        step=step,
        message=ToolResultMessage(
            id="m1",
            content=(
                ToolResultBlock(tool_call_id=answered, content=(TextBlock(text=text),)),
                *extra,
            ),
            source=ToolSource(call_id=call_id),
        ),
        meta=meta,
    ),
    _ints,
    _ints,
    st.sampled_from(["c1", "c2"]),
    st.sampled_from(["c1", "c2"]),
    _texts,
    _maybe | _open,
    st.lists(st.builds(TextBlock, text=_texts), max_size=1),
)
_user_messages = st.builds(
    UserMessage,
    id=st.sampled_from(["u1", ""]),
    content=st.lists(st.builds(TextBlock, text=_texts), max_size=2).map(tuple),
    source=st.just(UserSource())
    | st.builds(PluginSource, plugin=st.just("p"), sections=_maybe | _open, summary=_maybe | _texts),
)
_assistant_messages = st.builds(
    AssistantMessageData,
    turn=_ints,
    step=_ints,
    message=st.builds(
        AssistantMessage,
        id=st.just("a1"),
        content=st.lists(st.builds(TextBlock, text=_texts), max_size=2).map(tuple),
        source=st.builds(
            ModelSource, provider=st.just("p"), model=st.just("m"), replay_state=_maybe | _open
        ),
    ),
    usage=_maybe
    | st.builds(TokenUsage, input_tokens=_ints, output_tokens=_ints, reasoning_tokens=_maybe | _ints),
)
_turn_ends = st.builds(
    TurnEnd,
    turn=_ints,
    reason=st.just(CompletedReason()) | st.builds(ErrorReason, error=_failures),
)
_retries = st.builds(
    lambda budget, turn, retry, delay, failure: LlmRetryData(
        retry_id="r",
        turn=turn,
        step=1,
        provider="p",
        mode="always" if budget is msgspec.UNSET else "normal",  # its own invariant
        policy_key="k",
        retry=retry,
        max_retries=budget,
        delay_ms=delay,
        failure=failure,
    ),
    _maybe | _ints,
    _ints,
    _ints,
    _ints,
    _failures,
)
_PAYLOADS = {
    "tool/result": _tool_results,
    "user/message": _user_messages,
    "assistant/message": _assistant_messages,
    "turn/end": _turn_ends,
    "llm/retry": _retries,
}


def _plain_twin(value: Any) -> Any:
    """The plain JSON a Struct stands for (tag first, wire names, UNSET left out); other values
    are kept as they are, flaws included."""
    if isinstance(value, msgspec.Struct):
        config = value.__struct_config__
        out: dict[str, Any] = {}
        if config.tag_field is not None:
            out[config.tag_field] = config.tag
        for attr, name in zip(value.__struct_fields__, value.__struct_encode_fields__, strict=True):
            field = getattr(value, attr)
            if field is not msgspec.UNSET:
                out[name] = _plain_twin(field)
        return out
    if type(value) in (list, tuple):
        return [_plain_twin(x) for x in value]
    if type(value) in (dict, MappingProxyType):
        return {k: _plain_twin(x) for k, x in value.items()}
    return value


def _same(a: Any, b: Any) -> bool:
    """Equal, with the same types all the way down (Structs field by field, key order too)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, msgspec.Struct):
        return all(_same(getattr(a, f), getattr(b, f)) for f in a.__struct_fields__)
    if type(a) in (dict, MappingProxyType):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if type(a) in (list, tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if type(a) is float and math.isnan(a):
        return math.isnan(b)
    return bool(a == b)


def _outcome(event_type: str, data: Any) -> tuple[str, Any]:
    try:
        return "stored", coerce_event_data(event_type, data)
    except InvalidSessionEventError as exc:
        return "refused", str(exc)


@pytest.mark.parametrize("event_type", sorted(_PAYLOADS))
@settings(max_examples=300)
@given(data=st.data())
def test_a_typed_payload_is_stored_or_refused_as_its_plain_twin(
    event_type: str, data: st.DataObject
) -> None:
    typed = data.draw(_PAYLOADS[event_type])
    fast = _outcome(event_type, typed)  # the Struct of the registered type: the fast path first
    general = _outcome(event_type, _plain_twin(typed))  # plain JSON: the general path only
    assert fast[0] == general[0], (fast, general)
    if fast[0] == "stored":
        assert _same(fast[1], general[1]), (fast[1], general[1])
    else:
        assert fast[1] == general[1]
