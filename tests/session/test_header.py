"""SessionHeader validation and session ids."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from dsh_host._session import (
    SESSION_FORMAT_VERSION,
    InvalidSessionHeaderError,
    InvalidSessionIdError,
    Session,
    SessionHeader,
    check_session_id,
    parse_session_header,
)


def header(**fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"version": 3, "id": "s", "createdAt": 1000}
    base.update(fields)
    return base


def test_a_full_header_is_accepted_frozen_and_written_in_key_order() -> None:
    value = parse_session_header(
        header(
            cwd="/home/dev/project",
            parentSession="p",
            isSeeded=True,
            origin="subagent",
            delegationDepth=1,
            agentPreset="ptc",
        )
    )
    assert SESSION_FORMAT_VERSION == 3
    assert list(value.to_json()) == [
        "version",
        "id",
        "createdAt",
        "cwd",
        "parentSession",
        "isSeeded",
        "origin",
        "delegationDepth",
        "agentPreset",
    ]
    with pytest.raises(AttributeError):
        value.cwd = "/x"  # type: ignore[misc]
    assert msgspec.json.encode(parse_session_header(header())) == (
        b'{"version":3,"id":"s","createdAt":1000,"isSeeded":false}'
    )


@pytest.mark.parametrize(
    ("fields", "message", "field"),
    [
        ({"cwd": "relative/dir"}, 'cwd must be an absolute path, got "relative/dir"', "cwd"),
        ({"cwd": 5}, "cwd must be a string", "cwd"),
        ({"createdAt": 1.5}, "createdAt must be a non-negative safe integer", "createdAt"),
        ({"createdAt": -1}, "createdAt must be a non-negative safe integer", "createdAt"),
        ({"createdAt": 2**53}, "not losslessly JSON-serializable", None),
        ({"version": 0}, "version must be 3, got 0", "version"),
        ({"version": 4}, "version must be 3, got 4", "version"),
        ({"parentSession": 1}, "parentSession must be a string", "parentSession"),
        ({"origin": "user"}, 'origin must be "subagent"', "origin"),
        ({"delegationDepth": -1}, "delegationDepth must be a non-negative safe integer", None),
        ({"delegationDepth": "1"}, "delegationDepth must be a non-negative safe integer", None),
        ({"agentPreset": 3}, "agentPreset must be a string", "agentPreset"),
        ({"isSeeded": "yes"}, "isSeeded must be a boolean", "isSeeded"),
        ({"seedLength": 3}, "unknown key(s) 'seedLength'", "seedLength"),
        ({"colour": "red"}, "unknown key(s) 'colour'", "colour"),
        ({"sandboxMode": "x"}, "retired policy baseline fields", None),
        ({"approvalPolicy": "x"}, "retired policy baseline fields", None),
        ({"meta": float("nan")}, "not losslessly JSON-serializable", None),
    ],
)
def test_invalid_headers_name_the_field(
    fields: dict[str, Any], message: str, field: str | None
) -> None:
    with pytest.raises(InvalidSessionHeaderError) as info:
        parse_session_header(header(**fields))
    assert message in str(info.value)
    assert str(info.value).startswith("session header")
    if field is not None:
        assert info.value.field == field


def test_header_must_be_a_mapping_and_match_the_session_id() -> None:
    with pytest.raises(InvalidSessionHeaderError, match="not a plain JSON record"):
        parse_session_header([1, 2])
    with pytest.raises(InvalidSessionHeaderError, match='id "s" does not match session id "t"'):
        parse_session_header(header(), session_id="t")


def test_session_ids_are_opaque_non_empty_strings() -> None:
    with pytest.raises(InvalidSessionIdError, match="non-empty"):
        check_session_id("")
    with pytest.raises(InvalidSessionIdError, match="must be a string"):
        check_session_id(5)
    with pytest.raises(InvalidSessionIdError):
        Session.create("")
    # Path separators and dot segments are not rejected: storage escapes ids injectively,
    # so the id is kept verbatim (never silently rewritten or dropped).
    for tricky in ("../../etc/pwn", "a/b", "a\\b", "..", ".", "~002E", "名前"):
        session = Session.create(tricky)
        assert session.id == tricky
        assert session.header.id == tricky


def test_a_supplied_header_is_used_and_a_missing_one_is_synthesized() -> None:
    session = Session.create("s", header=header(cwd="/w"), clock=lambda: 42)
    assert session.header == SessionHeader(id="s", created_at=1000, cwd="/w")
    fresh = Session.create("t", clock=lambda: 42)
    assert fresh.header == SessionHeader(id="t", created_at=42)
