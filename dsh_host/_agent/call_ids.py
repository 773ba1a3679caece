"""Harness-owned call identity: every tool call of a session has its own non-empty id.

The log pairs everything by call id: a ``tool/call`` with its ``tool/result``,
an ``approval/asked`` with its call, a deferred call with the decision made for
it in another process, crash repair's pending calls with what answered them,
and the model's next request pairs each ``tool_calls`` entry with its ``tool``
message. A provider's ids cannot carry that weight: local servers and some
providers send ``call_0`` in every response, or the same id twice in one
response, or none at all. With two calls under one id, a decision meant for
the first runs the second (twice), repair answers one of them and the next
request is unbalanced; an empty id runs the tool and then the log refuses its
result.

So the agent loop takes ownership of the ids at the one place a model's calls
enter the log, the ``assistant/message`` of a step (:meth:`CallIds.own`):

- a provider id that is non-empty and not yet used in the session is kept
  as it is (the common case: nothing changes on the wire or in the log);
- any other gets a minted id (``call_`` + 24 hex digits: the shape OpenAI,
  DeepSeek and Anthropic all accept), and the provider's id is kept beside
  it on the block as ``providerId`` (``""`` when the provider sent none).

Everything after that uses the block's ``id``: the ``tool/call`` and
``tool/result`` events, approvals, ``$DSH_CALL_ID``, crash repair, and the
history sent back to the provider in later requests, where the assistant's
``tool_calls`` and the ``tool`` results carry the same minted id. Sending the
minted id back is what keeps a request balanced: a provider pairs calls and
results only within the request, so any consistent id is valid there, while
sending its own repeated ids back would reproduce the ambiguity. The raw
stream the provider sent (with its ids) is still in the message's ``stream``
records, so the log stays faithful to the wire.
"""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING

import msgspec

from dsh_host._session.events import AssistantMessageData, ToolCallData, ToolResultData
from dsh_host._session.messages import AssistantMessage, ContentBlock, ToolCallBlock

if TYPE_CHECKING:
    from dsh_host._session.session import Session

__all__ = ["CallIds", "mint_call_id"]


def mint_call_id() -> str:
    """A fresh call id: ``call_`` and 24 random hex digits (96 bits)."""
    return f"call_{secrets.token_hex(12)}"


class CallIds:
    """The call ids a session already used, and the ownership rule for new ones.

    The set is built from the log itself (every ``tool-call`` block of an
    ``assistant/message``, every ``tool/call`` and ``tool/result``), caught up
    incrementally, so a resumed or continued session knows the ids of every
    earlier process's turns.
    """

    __slots__ = ("_scanned", "_seen", "_session")

    def __init__(self, session: Session) -> None:
        self._session = session
        self._seen: set[str] = set()
        self._scanned = 0

    def _catch_up(self) -> None:
        events = self._session.events
        seen = self._seen
        for event in events.iter_from(self._scanned):  # page by page (docs/decisions.md D46)
            data = event.data
            if isinstance(data, AssistantMessageData):
                for block in data.message.content:
                    if isinstance(block, ToolCallBlock):
                        seen.add(block.id)
            elif isinstance(data, ToolCallData):
                seen.add(data.call_id)
            elif isinstance(data, ToolResultData):
                seen.add(data.message.source.call_id)
        self._scanned = len(events)

    def own(self, message: AssistantMessage) -> AssistantMessage:
        """``message`` with every tool call's id unique and non-empty in the session.

        Returns ``message`` itself when every provider id could be kept.
        """
        self._catch_up()
        seen = self._seen
        content: list[ContentBlock] = []
        changed = False
        for block in message.content:
            if isinstance(block, ToolCallBlock):
                if not block.id or block.id in seen:
                    minted = mint_call_id()
                    while minted in seen:  # pragma: no cover - 96 random bits
                        minted = mint_call_id()
                    block = msgspec.structs.replace(block, id=minted, provider_id=block.id)
                    changed = True
                seen.add(block.id)
            content.append(block)
        if not changed:
            return message
        return msgspec.structs.replace(message, content=tuple(content))
