"""The envelope of one log entry and its surface marker."""

from __future__ import annotations

from typing import Any, Literal, TypeAlias

import msgspec
from msgspec import UNSET, UnsetType

from dsh_host._session.messages import (
    NonNegativeInt,
    Wire,
)

# --- surface markers -----------------------------------------------------------------------


class ReplaceOp(Wire, frozen=True, kw_only=True):
    """``{op: "replace", startSeq, endSeq}``: shadow the surface nodes ``start..end`` (inclusive).

    On the wire the range is ``startSeq``/``endSeq``, as DSH v3 requires (its v3 admission
    refuses a replace spelled otherwise); the older ``start``/``end`` spelling (DSH v2, and
    logs earlier dsh builds wrote) is still read.
    """

    op: Literal["replace"] = "replace"  #: always "replace"
    start: NonNegativeInt = msgspec.field(name="startSeq")  #: seq of the first shadowed node
    end: NonNegativeInt = msgspec.field(name="endSeq")  #: seq of the last shadowed node


#: How a surface event entered the surface: appended at the tail, or replacing a range.
SurfaceOp: TypeAlias = Literal["append"] | ReplaceOp


# --- the envelope --------------------------------------------------------------------------


class SessionEvent(msgspec.Struct, frozen=True, kw_only=True, rename="camel", gc=False):
    """One immutable entry of a session log.

    Invariants (enforced by :class:`~dsh_host._session.session.Session`, not by
    construction): ``seq`` equals the event's index; ``surface_op`` is present
    exactly on surface-eligible types; ``source_event_seqs`` only on those.
    """

    type: str  #: event type, e.g. ``turn/start``
    seq: int  #: position in the log (== index), contiguous from 0
    time: int  #: Unix epoch milliseconds (may step backwards)
    data: Any  #: typed frozen Struct, or frozen JSON for opaque/ignorable types
    source_event_seqs: tuple[int, ...] | UnsetType = UNSET  #: cited earlier events (surface only)
    surface_op: SurfaceOp | UnsetType = UNSET  #: required on surface types, forbidden elsewhere
    ignorable: Literal[True] | UnsetType = UNSET  #: a reader may keep it without understanding it
    #: The record's JSON exactly as decoded, kept only when the typed fields would encode it
    #: differently (keys this build does not model, e.g. DSH's ``TokenUsage.totalTokens``; a
    #: marker an unknown ignorable type carried), or when built in an exact key order (repair
    #: closers in DSH's). :func:`encode_event` writes it and :func:`event_to_builtins` returns
    #: it, so every view and every copy shows what the log holds. Never encode a SessionEvent
    #: with msgspec directly.
    wire: bytes | UnsetType = UNSET
