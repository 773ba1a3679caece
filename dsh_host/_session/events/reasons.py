"""Why a turn ended: the kind-tagged, open ``turn/end`` reasons."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, TypeAlias

import msgspec

from dsh_host._jsonsafe import (
    freeze_json,
    json_dec_hook,
    json_enc_hook,
)
from dsh_host._session.messages import (
    LlmFailure,
    PositiveInt,
    Wire,
)

# --- turn end reasons (kind-tagged, open) --------------------------------------------------


class UserCancel(Wire, frozen=True, kw_only=True, tag="user", tag_field="kind"):
    """The user cancelled."""


class ParentCancel(Wire, frozen=True, kw_only=True, tag="parent", tag_field="kind"):
    """The parent agent cancelled."""


class HookCancel(Wire, frozen=True, kw_only=True, tag="hook", tag_field="kind"):
    """A hook cancelled."""

    reason: str  #: the hook's reason


class DisposedCancel(Wire, frozen=True, kw_only=True, tag="disposed", tag_field="kind"):
    """The agent was disposed."""


class LegacyCancel(Wire, frozen=True, kw_only=True, tag="legacy", tag_field="kind"):
    """Imported from an old record that carried no cause."""


#: Why an active agent driver was cancelled.
AgentCancelCause: TypeAlias = UserCancel | ParentCancel | HookCancel | DisposedCancel
#: A durable cancellation cause (adds ``legacy`` for imports).
TurnEndCancelCause: TypeAlias = AgentCancelCause | LegacyCancel


class CompletedReason(Wire, frozen=True, kw_only=True, tag="completed", tag_field="kind"):
    """Normal end (or an empty entered turn)."""


class AbortedReason(Wire, frozen=True, kw_only=True, tag="aborted", tag_field="kind"):
    """Cancellation interrupted the live turn."""

    reason: TurnEndCancelCause  #: who cancelled


class BlockedReason(Wire, frozen=True, kw_only=True, tag="blocked", tag_field="kind"):
    """Pre-step rejected the turn."""


class ErrorReason(Wire, frozen=True, kw_only=True, tag="error", tag_field="kind"):
    """The turn failed; non-LLM errors are flattened to ``code: "UNKNOWN"``."""

    error: LlmFailure  #: the failure


class MaxTokensReason(Wire, frozen=True, kw_only=True, tag="max-tokens", tag_field="kind"):
    """Some step hit the output ceiling (sticky for the turn)."""


class MaxTurnRequestsReason(
    Wire, frozen=True, kw_only=True, tag="max-turn-requests", tag_field="kind"
):
    """The turn reached the agent's step limit (``maxStepsPerTurn``) and still wanted to go on.

    Written by the loop's loop guard, not by DSH: DSH's ``TurnEndReasonMap``
    reserves ACP's ``max_turn_requests`` for the producer that first emits it,
    spelled like ``max-tokens``. A reader that does not know the kind keeps it
    as an :class:`UnknownTurnEndReason` (the union is merge-extensible).
    """

    limit: PositiveInt  #: the step limit that was reached


class InterruptedReason(Wire, frozen=True, kw_only=True, tag="interrupted", tag_field="kind"):
    """Written only by crash repair (resume), never by the loop."""


class ForkedReason(Wire, frozen=True, kw_only=True, tag="forked", tag_field="kind"):
    """Written only into a fork seed, closing a turn open at the fork boundary."""


class UnknownTurnEndReason(Mapping[str, Any]):
    """A turn-end reason of a kind nobody registered: kept verbatim, never an error.

    The reason union is merge-extensible, so an unknown kind is a valid value
    (written by a plugin or a newer harness); every match over reasons needs a
    default branch that lands here. It is a read-only mapping of its JSON.
    """

    __slots__ = ("_json",)

    def __init__(self, value: Mapping[str, Any]) -> None:
        frozen = freeze_json(value, "turn/end reason")
        if not isinstance(frozen, Mapping) or not isinstance(frozen.get("kind"), str):
            raise ValueError("a turn/end reason must be a mapping with a string `kind`")
        self._json: Mapping[str, Any] = frozen

    @property
    def kind(self) -> str:
        """The reason's kind tag."""
        return str(self._json["kind"])

    def __getitem__(self, key: str) -> Any:
        return self._json[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._json)

    def __len__(self) -> int:
        return len(self._json)

    def __repr__(self) -> str:
        return f"UnknownTurnEndReason({dict(self._json)!r})"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, UnknownTurnEndReason):
            return dict(self._json) == dict(other._json)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.kind)


#: Why a turn ended (kind-tagged; plugins add kinds with :func:`register_turn_end_reason`).
TurnEndReason: TypeAlias = (
    CompletedReason
    | AbortedReason
    | BlockedReason
    | ErrorReason
    | MaxTokensReason
    | MaxTurnRequestsReason
    | InterruptedReason
    | ForkedReason
    | UnknownTurnEndReason
)

_TURN_END_REASONS: dict[str, type[msgspec.Struct]] = {
    cls.__struct_config__.tag: cls  # type: ignore[misc]
    for cls in (
        CompletedReason,
        AbortedReason,
        BlockedReason,
        ErrorReason,
        MaxTokensReason,
        MaxTurnRequestsReason,
        InterruptedReason,
        ForkedReason,
    )
}


def turn_end_kind(reason: TurnEndReason) -> str:
    """The ``kind`` of any turn-end reason, registered or not (for a match's default branch)."""
    if isinstance(reason, UnknownTurnEndReason):
        return reason.kind
    return str(reason.__struct_config__.tag)


def register_turn_end_reason(reason_type: type[msgspec.Struct]) -> Callable[[], None]:
    """Teach decoding a plugin's turn-end kind (a Struct with ``tag_field="kind"``).

    Returns a disposer. Unregistered kinds still decode, as
    :class:`UnknownTurnEndReason`.
    """
    config = reason_type.__struct_config__
    kind = config.tag
    if config.tag_field != "kind" or not isinstance(kind, str):
        raise TypeError(f"{reason_type.__qualname__} must be a Struct with tag_field='kind'")
    existing = _TURN_END_REASONS.get(kind)
    if existing is not None and existing is not reason_type:
        raise ValueError(f"turn/end reason kind {kind!r} is already registered by {existing!r}")
    _TURN_END_REASONS[kind] = reason_type

    def dispose() -> None:
        if _TURN_END_REASONS.get(kind) is reason_type:
            del _TURN_END_REASONS[kind]

    return dispose


if TYPE_CHECKING:
    _AnyTurnEndReason = TurnEndReason
else:

    class _AnyReasonMeta(type):
        def __instancecheck__(cls, instance: object) -> bool:
            return True

    class _AnyTurnEndReason(metaclass=_AnyReasonMeta):
        """Annotation that routes reason decoding through :func:`_dec_hook` (open union)."""


def _decode_turn_end_reason(obj: Any) -> Any:
    if not isinstance(obj, Mapping):
        raise msgspec.ValidationError("a turn/end reason must be an object with a `kind`")
    kind = obj.get("kind")
    if not isinstance(kind, str):
        raise msgspec.ValidationError("a turn/end reason must have a string `kind`")
    reason_type = _TURN_END_REASONS.get(kind)
    if reason_type is None:
        return UnknownTurnEndReason(obj)
    return msgspec.convert(obj, reason_type, dec_hook=_dec_hook)


def _dec_hook(tp: type, obj: Any) -> Any:
    if tp is _AnyTurnEndReason:  # type: ignore[comparison-overlap]
        return _decode_turn_end_reason(obj)
    return json_dec_hook(tp, obj)


def _enc_hook(value: Any) -> Any:
    if isinstance(value, UnknownTurnEndReason):
        return dict(value._json)
    if isinstance(value, Mapping):
        return dict(value)
    return json_enc_hook(value)
