"""DSH v3 retired ``request/header``'s ``header.system``: the session core refuses it at append.

The JSONL v3 reader refuses a log whose ``request/header`` carries ``header.system``
("rejects retired header.system"), so accepting it at append would write a log that
cannot be read back. The system prompt is a ``system/message`` event instead.
"""

from __future__ import annotations

from typing import Any

import pytest

from dsh_host._session.errors import InvalidSeedError, InvalidSessionEventError
from dsh_host._session.events import RequestHeaderData, decode_event
from dsh_host._session.messages import EpochHeader, LlmCallConfig
from dsh_host._session.session import Session

CONFIG = {"provider": "mock", "model": "m"}


def opened() -> Session:
    session = Session.create("retired-system")
    session.append("turn/start", {"turn": 1})
    session.append("step/start", {"turn": 1, "step": 1})
    return session


@pytest.mark.parametrize(
    "data",
    [
        {"header": {"config": CONFIG, "system": "be brief"}, "reason": "initial"},
        {"header": {"config": CONFIG, "system": ""}, "reason": "change"},
        RequestHeaderData(
            header=EpochHeader(config=LlmCallConfig(provider="mock", model="m"), system="x"),
            reason="initial",
        ),
    ],
    ids=["plain", "plain-empty", "typed"],
)
def test_append_refuses_header_system_naming_type_and_field(data: Any) -> None:
    session = opened()
    before = len(session.events)
    with pytest.raises(InvalidSessionEventError, match=r"header\.system") as raised:
        session.append("request/header", data)
    message = str(raised.value)
    assert 'session event "request/header"' in message
    assert "DSH v3 retired" in message and "system/message" in message
    assert raised.value.event_type == "request/header"
    assert len(session.events) == before  # the log is unchanged


def test_a_header_without_system_is_accepted_and_folded() -> None:
    session = opened()
    session.append("request/header", {"header": {"config": CONFIG}, "reason": "initial"})
    header = session.request_header()
    assert header is not None and header.config.model == "m"


def test_seeds_and_decoded_records_refuse_it_too() -> None:
    record = {
        "type": "request/header",
        "seq": 0,
        "time": 1,
        "data": {"header": {"config": CONFIG, "system": "x"}, "reason": "initial"},
    }
    with pytest.raises(InvalidSessionEventError, match=r"header\.system"):
        decode_event(record)
    with pytest.raises(InvalidSeedError, match=r"header\.system"):
        Session.create("seeded", seed=[record])
