"""``SessionHeader``: immutable storage metadata kept outside the event log.

The header never reaches message derivation; it says which session a log is,
where it was created, and its lineage. Shape (DSH log format v3, D1), written in
this key order with absent optionals omitted::

    {version, id, createdAt, cwd?, parentSession?, isSeeded, origin?,
     delegationDepth?, agentPreset?}

(The JSONL line adds ``type: "session"`` and writes ``delegationDepth`` as 0 when
unset; that is the backend's framing, not part of this value.)

Validation is strict: unknown keys are refused (a key we do not understand may
change what the header means), and every field error uses DSH's text, word for word.
"""

from __future__ import annotations

import datetime
import os
import time
from collections.abc import Mapping
from typing import Any, Final, Literal

from msgspec import UNSET, UnsetType

from dsh_host._jsonsafe import NonJsonValueError, is_safe_int, to_json_builtins
from dsh_host._session.errors import InvalidSessionHeaderError, InvalidSessionIdError
from dsh_host._session.messages import NonNegativeInt, Wire

__all__ = [
    "HEADER_KEYS",
    "SESSION_FORMAT_VERSION",
    "SessionHeader",
    "check_session_id",
    "header_from_meta",
    "new_session_id",
    "now_ms",
    "parse_session_header",
]

#: The logical log format this build writes (DSH v3; D1).
SESSION_FORMAT_VERSION: Final = 3

#: Accepted header keys, in written order.
HEADER_KEYS: Final = (
    "version",
    "id",
    "createdAt",
    "cwd",
    "parentSession",
    "isSeeded",
    "origin",
    "delegationDepth",
    "agentPreset",
)


def now_ms() -> int:
    """Unix epoch milliseconds, as an int (the unit of ``time`` and ``createdAt``)."""
    return time.time_ns() // 1_000_000


class SessionHeader(Wire, frozen=True, kw_only=True):
    """Validated, immutable header of one session (build it with :func:`parse_session_header`)."""

    version: int = SESSION_FORMAT_VERSION  #: logical format version (3)
    id: str  #: the session id
    created_at: NonNegativeInt  #: creation time, epoch ms
    cwd: str | UnsetType = UNSET  #: absolute working directory
    parent_session: str | UnsetType = UNSET  #: the session this one was forked from
    is_seeded: bool = False  #: the log starts with a fork-inherited prefix
    origin: Literal["subagent"] | UnsetType = UNSET  #: set for subagent children
    delegation_depth: NonNegativeInt | UnsetType = UNSET  #: absent means 0
    agent_preset: str | UnsetType = UNSET  #: the agent preset the session was composed from

    def to_json(self) -> dict[str, Any]:
        """The header as a plain mapping in written key order."""
        out: dict[str, Any] = to_json_builtins(self, "session header")
        return out


def new_session_id() -> str:
    """A readable, time-sortable id unique across processes and runs: ``20261129-164012-3fa9c1``.

    UTC time to the second plus 24 random bits, so ids minted by different
    processes (the CLI, a library script run twice) do not collide.
    """
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%d-%H%M%S")
    return f"{stamp}-{os.urandom(3).hex()}"


def check_session_id(session_id: object) -> str:
    """Return ``session_id`` if it is a usable id, else raise :class:`InvalidSessionIdError`.

    Ids are opaque strings: any non-empty string is accepted, including ``/``,
    ``..`` or non-ASCII text, because storage escapes ids injectively
    (``encode_segment``) instead of trusting them as path components.
    """
    if not isinstance(session_id, str):
        raise InvalidSessionIdError(
            f"session id must be a string, got {type(session_id).__qualname__}"
        )
    if not session_id:
        raise InvalidSessionIdError("session id must be a non-empty string")
    return session_id


def _fail(message: str, field: str | None = None) -> InvalidSessionHeaderError:
    return InvalidSessionHeaderError(message, field=field)


def parse_session_header(value: object, *, session_id: str | None = None) -> SessionHeader:
    """Validate a header mapping (or a :class:`SessionHeader`) and return it frozen.

    ``session_id``, when given, must equal the header's ``id``. A legacy
    ``seedLength`` is refused here (storage migrates old headers before this).
    """
    if isinstance(value, SessionHeader):
        value = value.to_json()
    if not isinstance(value, Mapping):
        raise _fail("session header is not a plain JSON record")
    try:
        raw: dict[str, Any] = to_json_builtins(value, "session header")
    except NonJsonValueError as exc:
        raise _fail(
            f"session header is not losslessly JSON-serializable: {exc.problem} at {exc.path}"
        ) from exc
    if "sandboxMode" in raw or "approvalPolicy" in raw:
        raise _fail("session header uses retired policy baseline fields")
    unknown = [k for k in raw if k not in HEADER_KEYS]
    if unknown:
        raise _fail(
            f"session header has unknown key(s) {', '.join(repr(k) for k in unknown)}; "
            f"allowed keys are {', '.join(HEADER_KEYS)}",
            field=unknown[0],
        )
    version = raw.get("version")
    if version != SESSION_FORMAT_VERSION or not is_safe_int(version):
        raise _fail(
            f"session header version must be {SESSION_FORMAT_VERSION}, got {version!r}", "version"
        )
    hid = raw.get("id")
    if not isinstance(hid, str):
        raise _fail("session header id must be a string", "id")
    check_session_id(hid)
    if session_id is not None and hid != session_id:
        raise _fail(f'session header id "{hid}" does not match session id "{session_id}"', "id")
    created = raw.get("createdAt")
    if not is_safe_int(created) or created < 0:  # type: ignore[operator]
        raise _fail("session header createdAt must be a non-negative safe integer", "createdAt")
    kwargs: dict[str, Any] = {"id": hid, "created_at": created}
    if "cwd" in raw:
        cwd = raw["cwd"]
        if not isinstance(cwd, str):
            raise _fail("session header cwd must be a string", "cwd")
        if not os.path.isabs(cwd):
            raise _fail(f'session header cwd must be an absolute path, got "{cwd}"', "cwd")
        kwargs["cwd"] = cwd
    if "parentSession" in raw:
        parent = raw["parentSession"]
        if not isinstance(parent, str):
            raise _fail("session header parentSession must be a string", "parentSession")
        kwargs["parent_session"] = parent
    if "isSeeded" in raw:
        if not isinstance(raw["isSeeded"], bool):
            raise _fail("session header isSeeded must be a boolean", "isSeeded")
        kwargs["is_seeded"] = raw["isSeeded"]
    if "origin" in raw:
        if raw["origin"] != "subagent":
            raise _fail('session header origin must be "subagent"', "origin")
        kwargs["origin"] = "subagent"
    if "delegationDepth" in raw:
        depth = raw["delegationDepth"]
        if not is_safe_int(depth) or depth < 0:
            raise _fail(
                "session header delegationDepth must be a non-negative safe integer",
                "delegationDepth",
            )
        kwargs["delegation_depth"] = depth
    if "agentPreset" in raw:
        preset = raw["agentPreset"]
        if not isinstance(preset, str):
            raise _fail("session header agentPreset must be a string", "agentPreset")
        kwargs["agent_preset"] = preset
    return SessionHeader(**kwargs)


#: Optional header keys for which ``None`` means absent (as DSH writes them: ``undefined``).
_OPTIONAL_KEYS: Final = frozenset(
    {"cwd", "parentSession", "isSeeded", "origin", "delegationDepth", "agentPreset"}
)


def header_from_meta(meta: Mapping[str, Any]) -> SessionHeader:
    """The header of a session being created, validated: the one check every backend's
    ``create`` makes (the persistence service's :func:`~dsh_host._persistence.backend.new_header`
    and the JSONL codec's header record both call it).

    ``meta`` is a header as plain JSON (``SessionHeader.to_json()`` or a caller's mapping):
    ``version`` defaults to the current one, ``None`` for an optional key means absent, and the
    0.1.1 spelling ``seedLength`` (the fork cut) stands for ``isSeeded``. Everything else is
    :func:`parse_session_header`'s; raises :class:`InvalidSessionHeaderError`.
    """
    if not isinstance(meta, Mapping):
        raise _fail("session header is not a plain JSON record")
    raw = {
        key: value
        for key, value in meta.items()
        if not (value is None and key in _OPTIONAL_KEYS)
        and not (key == "type" and value == "session")  # a stored record's line tag
    }
    created = raw.get("createdAt")
    if not is_safe_int(created) or created < 0:  # type: ignore[operator]
        raise _fail(
            "session metadata createdAt must be a non-negative safe integer", "createdAt"
        )
    raw.setdefault("version", SESSION_FORMAT_VERSION)
    if "seedLength" in raw:
        seed_length = raw.pop("seedLength")
        if seed_length is not None and (not is_safe_int(seed_length) or seed_length < 0):
            raise _fail(
                "session header seedLength must be a non-negative safe integer", "seedLength"
            )
        raw.setdefault("isSeeded", seed_length is not None)
    return parse_session_header(raw)
