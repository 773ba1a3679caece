"""Each provider's wire format, for the adapter contract suite (test_adapter_contract.py).

A :class:`Wire` renders one provider-neutral scenario (a streamed text answer, tool calls with
arguments in fragments, reasoning, a native error for a dsh code, a stream that is cut, ends
early or hangs) as the bytes that provider's API sends, served by the loopback
:class:`~sse_server.SseServer`. A new provider plugin adds one ``Wire`` here and one entry in
``WIRES``; the contract tests then run against it unchanged.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from .sse_server import Behavior, http_error, reasoning_events, sse, text_events, tool_call_events

__all__ = ["WIRES", "AnthropicWire", "LiteLLMWire", "OpenAIWire", "ResponsesWire", "Wire"]

#: (name, arguments) of a tool call in a scenario; ids are the wire's own
Call = tuple[str, str]


@dataclass(frozen=True)
class Wire:
    """One provider plugin, seen from the wire."""

    #: the contract's id for it
    id: str
    #: the plugin (entry point) name and its ``--model`` prefix
    plugin: str
    provider: str
    model: str

    def row_config(self, base_url: str, key_env: str) -> dict[str, Any]:
        return {"base_url": base_url, "api_key_env": key_env}

    # scenarios -------------------------------------------------------------------------
    def text(self, parts: list[str], *, usage: tuple[int, int, int]) -> Behavior:
        """``parts`` streamed as text; usage (uncached input, output, cache read)."""
        raise NotImplementedError

    def tool_calls(self, calls: list[Call], *, fragment: int) -> Behavior:
        raise NotImplementedError

    def reasoning(self, thinking: list[str], text: list[str]) -> Behavior:
        raise NotImplementedError

    def error(self, code: str, message: str, retry_after: str | None = None) -> Behavior:
        """The provider's own HTTP answer for the dsh ``code``."""
        raise NotImplementedError

    def empty(self) -> Behavior:
        """A complete, normally stopped answer without any content block."""
        raise NotImplementedError

    def cut(self, parts: list[str]) -> Behavior:
        """Some text, then the connection drops mid-body."""
        raise NotImplementedError

    def early_end(self, parts: list[str]) -> Behavior:
        """Some text, then a clean end of the body before the answer is complete."""
        raise NotImplementedError

    def hang(self, parts: list[str]) -> Behavior:
        """Some text, then silence with the response open."""
        raise NotImplementedError

    def malformed(self) -> Behavior:
        raise NotImplementedError


class OpenAIWire(Wire):
    """Chat completions over SSE (``llm-openai-compatible``)."""

    def text(self, parts: list[str], *, usage: tuple[int, int, int]) -> Behavior:
        uncached, output, cached = usage
        return sse(text_events(*parts, usage={
            "prompt_tokens": uncached + cached, "completion_tokens": output,
            "prompt_tokens_details": {"cached_tokens": cached},
        }))

    def tool_calls(self, calls: list[Call], *, fragment: int) -> Behavior:
        wired = [(f"call_{n}", name, args) for n, (name, args) in enumerate(calls)]
        return sse(tool_call_events(wired, fragment=fragment, interleave=True))

    def reasoning(self, thinking: list[str], text: list[str]) -> Behavior:
        return sse(reasoning_events(thinking, text))

    def error(self, code: str, message: str, retry_after: str | None = None) -> Behavior:
        status, kind = {
            "AUTH": (401, "invalid_api_key"),
            "RATE_LIMIT": (429, "rate_limit_exceeded"),
            "SERVER": (503, "service_unavailable"),
            "CONTEXT_WINDOW_EXCEEDED": (400, "context_length_exceeded"),
            "MODEL_NOT_FOUND": (404, "model_not_found"),
            "INVALID_REQUEST": (400, "invalid_request_error"),
        }[code]
        headers = {"retry-after": retry_after} if retry_after else {}
        return http_error(status, {"error": {"message": message, "type": kind, "code": kind}},
                          headers=headers)

    def empty(self) -> Behavior:
        return sse(text_events())  # a role chunk, an empty content, stop, [DONE]

    def _partial(self, parts: list[str]) -> list[str]:
        return text_events(*parts, done=False)[:-1]  # no finish_reason, no [DONE]

    def cut(self, parts: list[str]) -> Behavior:
        return sse(self._partial(parts), close_early=True)

    def early_end(self, parts: list[str]) -> Behavior:
        return sse(self._partial(parts))

    def hang(self, parts: list[str]) -> Behavior:
        return sse(self._partial(parts), hang=True)

    def malformed(self) -> Behavior:
        return sse([text_events("ok")[1], "{this is not json", "[DONE]"])


def _event(data: dict[str, Any]) -> bytes:
    return f"event: {data['type']}\ndata: {json.dumps(data)}\n\n".encode()


class AnthropicWire(Wire):
    """Anthropic Messages over SSE (``llm-anthropic``), shaped like the API's documented
    streams: typed events, one ``event:`` line each."""

    def _message(self, blocks: list[list[bytes]], stop: str, usage: tuple[int, int, int],
                 *, end: bool = True) -> list[bytes]:
        uncached, output, cached = usage
        pieces = [_event({"type": "message_start", "message": {
            "id": "msg_contract", "type": "message", "role": "assistant", "content": [],
            "model": self.model, "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": uncached, "cache_read_input_tokens": cached,
                      "cache_creation_input_tokens": 0, "output_tokens": 1},
        }})]
        for block in blocks:
            pieces += block
        if end:
            pieces.append(_event({"type": "message_delta",
                                  "delta": {"stop_reason": stop, "stop_sequence": None},
                                  "usage": {"output_tokens": output}}))
            pieces.append(_event({"type": "message_stop"}))
        return pieces

    @staticmethod
    def _block(index: int, start: dict[str, Any], deltas: list[dict[str, Any]],
               close: bool = True) -> list[bytes]:
        pieces = [_event({"type": "content_block_start", "index": index, "content_block": start})]
        pieces += [_event({"type": "content_block_delta", "index": index, "delta": d})
                   for d in deltas]
        if close:
            pieces.append(_event({"type": "content_block_stop", "index": index}))
        return pieces

    def _text_block(self, index: int, parts: list[str], close: bool = True) -> list[bytes]:
        return self._block(index, {"type": "text", "text": ""},
                           [{"type": "text_delta", "text": p} for p in parts], close)

    def text(self, parts: list[str], *, usage: tuple[int, int, int]) -> Behavior:
        return Behavior(pieces=self._message([self._text_block(0, parts)], "end_turn", usage))

    def tool_calls(self, calls: list[Call], *, fragment: int) -> Behavior:
        blocks = [
            self._block(n, {"type": "tool_use", "id": f"toolu_{n}", "name": name, "input": {}},
                        [{"type": "input_json_delta", "partial_json": args[k:k + fragment]}
                         for k in range(0, len(args), fragment)])
            for n, (name, args) in enumerate(calls)
        ]
        return Behavior(pieces=self._message(blocks, "tool_use", (10, 5, 0)))

    def reasoning(self, thinking: list[str], text: list[str]) -> Behavior:
        deltas: list[dict[str, Any]] = [{"type": "thinking_delta", "thinking": t}
                                        for t in thinking]
        deltas.append({"type": "signature_delta", "signature": "sig-contract"})
        blocks = [self._block(0, {"type": "thinking", "thinking": "", "signature": ""}, deltas),
                  self._text_block(1, text)]
        return Behavior(pieces=self._message(blocks, "end_turn", (20, 20, 30)))

    def error(self, code: str, message: str, retry_after: str | None = None) -> Behavior:
        status, kind = {
            "AUTH": (401, "authentication_error"),
            "RATE_LIMIT": (429, "rate_limit_error"),
            "SERVER": (529, "overloaded_error"),
            "CONTEXT_WINDOW_EXCEEDED": (400, "invalid_request_error"),
            "MODEL_NOT_FOUND": (404, "not_found_error"),
            "INVALID_REQUEST": (400, "invalid_request_error"),
        }[code]
        if code == "CONTEXT_WINDOW_EXCEEDED":
            message = f"prompt is too long: 210000 tokens > 200000 maximum ({message})"
        if code == "MODEL_NOT_FOUND":
            message = f"model: {message}"
        headers = {"retry-after": retry_after} if retry_after else {}
        return http_error(status, {"type": "error", "error": {"type": kind, "message": message}},
                          headers=headers)

    def empty(self) -> Behavior:
        return Behavior(pieces=self._message([], "end_turn", (1, 1, 0)))

    def _partial(self, parts: list[str]) -> list[bytes]:
        return self._message([self._text_block(0, parts, close=False)], "end_turn", (1, 1, 0),
                             end=False)

    def cut(self, parts: list[str]) -> Behavior:
        return Behavior(pieces=self._partial(parts), close_early=True)

    def early_end(self, parts: list[str]) -> Behavior:
        return Behavior(pieces=self._partial(parts))

    def hang(self, parts: list[str]) -> Behavior:
        return Behavior(pieces=self._partial(parts), hang=True)

    def malformed(self) -> Behavior:
        return Behavior(pieces=[*self._partial(["ok"]),
                                b"event: content_block_delta\ndata: {this is not json\n\n"])


class ResponsesWire(OpenAIWire):
    """OpenAI Responses over SSE (``llm-openai-responses``): typed ``response.*`` events around
    output items; HTTP errors are OpenAI's, as for chat completions."""

    def _stream(self, items: list[tuple[str, dict[str, Any], list[str], dict[str, Any]]],
                usage: tuple[int, int, int], *, end: bool = True,
                status: str = "completed") -> list[bytes]:
        """``items``: (delta event type, added item, deltas, done item) per output item."""
        uncached, output, cached = usage
        sequence = iter(range(10_000))

        def event(kind: str, **fields: Any) -> bytes:
            data = {"type": kind, "sequence_number": next(sequence), **fields}
            return f"event: {kind}\ndata: {json.dumps(data)}\n\n".encode()

        response = {"id": "resp_contract", "object": "response", "model": self.model,
                    "status": "in_progress", "output": []}
        pieces = [event("response.created", response=response)]
        for index, (delta_type, added, deltas, done) in enumerate(items):
            pieces.append(event("response.output_item.added", output_index=index, item=added))
            pieces += [event(delta_type, item_id=added["id"], output_index=index, delta=d,
                             **({"content_index": 0} if "text" in delta_type else {}))
                       for d in deltas]
            if end:
                pieces.append(event("response.output_item.done", output_index=index, item=done))
        if end:
            pieces.append(event(f"response.{status}", response={
                **response, "status": status,
                "incomplete_details": {"reason": "max_output_tokens"}
                if status == "incomplete" else None,
                "usage": {"input_tokens": uncached + cached, "output_tokens": output,
                          "input_tokens_details": {"cached_tokens": cached},
                          "output_tokens_details": {"reasoning_tokens": 0},
                          "total_tokens": uncached + cached + output},
            }))
        return pieces

    @staticmethod
    def _message(n: int, parts: list[str]) -> tuple[str, dict[str, Any], list[str],
                                                     dict[str, Any]]:
        added = {"type": "message", "id": f"msg_{n}", "role": "assistant",
                 "status": "in_progress", "content": []}
        done = {**added, "status": "completed", "content": [
            {"type": "output_text", "text": "".join(parts), "annotations": []}]}
        return "response.output_text.delta", added, parts, done

    def text(self, parts: list[str], *, usage: tuple[int, int, int]) -> Behavior:
        return Behavior(pieces=self._stream([self._message(0, parts)], usage))

    def tool_calls(self, calls: list[Call], *, fragment: int) -> Behavior:
        items = []
        for n, (name, args) in enumerate(calls):
            added = {"type": "function_call", "id": f"fc_{n}", "call_id": f"call_{n}",
                     "name": name, "arguments": "", "status": "in_progress"}
            items.append(("response.function_call_arguments.delta", added,
                          [args[k:k + fragment] for k in range(0, len(args), fragment)],
                          {**added, "arguments": args, "status": "completed"}))
        return Behavior(pieces=self._stream(items, (10, 5, 0)))

    def reasoning(self, thinking: list[str], text: list[str]) -> Behavior:
        added = {"type": "reasoning", "id": "rs_0", "summary": []}
        done = {**added, "summary": [{"type": "summary_text", "text": "".join(thinking)}],
                "encrypted_content": "gAAAA-contract"}
        items = [("response.reasoning_summary_text.delta", added, thinking, done),
                 self._message(1, text)]
        return Behavior(pieces=self._stream(items, (20, 20, 30)))

    def empty(self) -> Behavior:
        return Behavior(pieces=self._stream([], (1, 1, 0)))

    def _partial_pieces(self, parts: list[str]) -> list[bytes]:
        return self._stream([self._message(0, parts)], (1, 1, 0), end=False)

    def cut(self, parts: list[str]) -> Behavior:
        return Behavior(pieces=self._partial_pieces(parts), close_early=True)

    def early_end(self, parts: list[str]) -> Behavior:
        return Behavior(pieces=self._partial_pieces(parts))

    def hang(self, parts: list[str]) -> Behavior:
        return Behavior(pieces=self._partial_pieces(parts), hang=True)

    def malformed(self) -> Behavior:
        return Behavior(pieces=[*self._partial_pieces(["ok"]),
                                b"event: response.output_text.delta\ndata: {this is not json\n\n"])


class LiteLLMWire(OpenAIWire):
    """``llm-litellm``: LiteLLM's ``openai/`` provider in front of a chat-completions server, so
    the scenarios are the chat wire's; what is LiteLLM's is the adapter in between."""


WIRES: list[Wire] = [
    OpenAIWire("openai-compatible", "llm-openai-compatible", "deepseek-official", "deepseek-chat"),
    AnthropicWire("anthropic", "llm-anthropic", "anthropic", "claude-sonnet-4-5"),
    ResponsesWire("openai-responses", "llm-openai-responses", "openai", "gpt-5-mini"),
    LiteLLMWire("litellm", "llm-litellm", "litellm", "openai/gpt-4o-mini"),
]
