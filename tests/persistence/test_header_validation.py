"""A header being created is validated once, by ``dsh_host._session.header.header_from_meta``.

The persistence service (``new_header``) and the JSONL codec (``header_from_meta``) each had
their own copy of the checks (issue 33), and they disagreed: the codec dropped keys it did not
know where the core refuses them, and the texts differed. Now the codec asks the core, so the
same bad header gets the same reason from both; and a log format this build does not read gets
the one refusal text (``format_refusal``) from every store.
"""

from __future__ import annotations

from typing import Any

import pytest
from dsh_session_persistence_jsonl._codec import header_from_meta as jsonl_header_record

from dsh_host._persistence.backend import new_header
from dsh_host._persistence.persistence import (
    SessionAppendRejectedError,
    SessionFormatUnsupportedError,
    decode_stored_header,
)

BAD: list[tuple[dict[str, Any], str]] = [
    ({"id": "s", "createdAt": 0, "bogus": 1}, "unknown key(s) 'bogus'"),
    ({"id": "s", "createdAt": -1}, "createdAt must be a non-negative safe integer"),
    ({"id": "s", "createdAt": 0, "version": 2}, "version must be 3, got 2"),
    ({"id": "s", "createdAt": 0, "cwd": "relative"}, "cwd must be an absolute path"),
    ({"id": "s", "createdAt": 0, "sandboxMode": "x"}, "retired policy baseline fields"),
    ({"id": "s", "createdAt": 0, "seedLength": -2}, "seedLength must be a non-negative"),
]


@pytest.mark.parametrize(("meta", "reason"), BAD)
def test_the_service_and_the_jsonl_codec_refuse_a_header_for_the_same_reason(
    meta: dict[str, Any], reason: str
) -> None:
    with pytest.raises(SessionAppendRejectedError) as by_service:
        new_header(meta)
    with pytest.raises(ValueError) as by_codec:
        jsonl_header_record(meta)
    assert reason in str(by_service.value)
    assert str(by_codec.value) == str(by_service.value)


def test_a_good_header_becomes_the_same_record() -> None:
    meta = {"id": "s", "createdAt": 5, "cwd": "/w", "seedLength": 3, "parentSession": None}
    record = jsonl_header_record(meta)
    assert record == {
        "type": "session", "version": 3, "id": "s", "createdAt": 5, "cwd": "/w",
        "isSeeded": True, "delegationDepth": 0,
    }
    assert new_header(meta).to_json().items() <= record.items()


def test_a_format_this_build_does_not_read_is_refused_with_one_text() -> None:
    with pytest.raises(SessionFormatUnsupportedError, match=r"v9, but this harness reads DSH's"):
        decode_stored_header("s", '{"version": 9, "id": "s", "createdAt": 0}', where="db#s")
