"""LlmRuntime: routes, the llm/stream waterfall, the adapter boundary, prepared calls."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import aclosing
from typing import Any

import anyio
import anyio.lowlevel
import msgspec
import pytest
from msgspec import UNSET

from dsh_host import Row, open_host
from dsh_host._cancel import CancelToken
from dsh_host._llm import (
    BlockAssembler,
    LlmAdapter,
    LlmError,
    LlmRequest,
    LlmRuntime,
    ModelInfo,
    RetryPolicy,
    assemble,
    failure_of,
)
from dsh_host._plugin import Plugin
from dsh_host._session import (
    AdapterDefaults,
    AssistantMessage,
    BlockStartChunk,
    FinishChunk,
    LlmCallConfig,
    LlmFailure,
    ModelSource,
    StopFinish,
    StreamChunk,
    TextBlock,
    TextDeltaChunk,
)
from dsh_host.errors import AbortError, DshError

from .llm_helpers import collect, finish_count, request, terminal_failure, user

# both backends: stream closing and cancellation
pytestmark = [pytest.mark.anyio, pytest.mark.both_backends]


class FakeAdapter(LlmAdapter):
    """A hand-written adapter whose behaviour each test supplies."""

    def __init__(
        self,
        body: Callable[[LlmRequest], AsyncIterator[StreamChunk]] | None = None,
        info: Callable[[str, str], ModelInfo] | None = None,
    ) -> None:
        self.body = body
        self.info = info
        self.requests: list[LlmRequest] = []
        self.closed = 0

    async def resolve_model(
        self, provider: str, model: str, signal: CancelToken | None = None
    ) -> ModelInfo:
        if self.info is not None:
            return self.info(provider, model)
        return ModelInfo(provider=provider, id=model, name=model)

    def stream(self, request: LlmRequest) -> AsyncIterator[StreamChunk]:
        self.requests.append(request)
        assert self.body is not None
        return self.body(request)


def hello(text: str = "hello") -> Callable[[LlmRequest], AsyncIterator[StreamChunk]]:
    async def body(request: LlmRequest) -> AsyncGenerator[StreamChunk, None]:
        yield BlockStartChunk(index=0, block_type="text")
        yield TextDeltaChunk(index=0, text=text)
        yield FinishChunk(reason=StopFinish())

    return body


async def test_llm_plugin_provides_the_runtime_and_routes_a_stream() -> None:
    async with open_host([Row(name="llm")]) as host:
        llm = host.ctx.llm
        assert isinstance(llm, LlmRuntime)
        adapter = FakeAdapter(hello())
        llm.register_adapter(["fake"], adapter)
        result = await assemble(llm.stream(request("fake", "m")))
        assert result.blocks() == (TextBlock(text="hello"),)
        assert [p.id for p in llm.list_providers()] == ["fake"]
        assert adapter.requests[0].model == "m"


async def test_no_adapter_is_one_error_finish_and_prepare_raises() -> None:
    async with open_host([Row(name="llm")]) as host:
        chunks = await collect(host.ctx.llm.stream(request("nobody")))
        assert len(chunks) == 1
        kind, failure = terminal_failure(chunks)
        assert kind == "error" and failure.code == "NO_ADAPTER"
        assert failure.message.startswith('no adapter registered for provider "nobody"')
        with pytest.raises(LlmError) as caught:
            await host.ctx.llm.prepare_call(LlmCallConfig(provider="nobody", model="m"))
        assert caught.value.code == "NO_ADAPTER"


async def test_registration_is_all_or_nothing_replaceable_and_disposable() -> None:
    async with open_host([Row(name="llm")]) as host:
        llm: LlmRuntime = host.ctx.llm
        first = llm.register_adapter(["a", "b"], FakeAdapter(hello("A")))
        with pytest.raises(LlmError) as dup:
            llm.register_adapter(["c", "b"], FakeAdapter(hello()))
        assert dup.value.code == "DUPLICATE_ADAPTER"
        assert not llm.has_provider("c")  # nothing of the refused set was registered
        with pytest.raises(LlmError) as empty:
            llm.register_adapter([], FakeAdapter())
        assert empty.value.code == "INVALID_ADAPTER"
        first.replace(["b", "d"])
        assert sorted(p.id for p in llm.list_providers()) == ["b", "d"]
        first()
        first.dispose()  # twice is harmless
        assert llm.list_providers() == []
        with pytest.raises(LlmError) as gone:
            first.replace(["a"])
        assert gone.value.code == "REGISTRATION_DISPOSED"


class OwnerPlugin(Plugin):
    name = "owner"
    inject = ("llm",)

    def apply(self, ctx: Any, config: Any) -> None:
        ctx.llm.register_adapter(["owned"], FakeAdapter(hello()), owner=ctx)


async def test_routes_are_released_when_the_owning_plugin_unloads() -> None:
    rows = [Row(name="llm"), Row(id="owner", name=f"{__name__}:OwnerPlugin")]
    async with open_host(rows) as host:
        assert host.ctx.llm.has_provider("owned")
        await host.unload("owner")
        assert not host.ctx.llm.has_provider("owned")


async def test_adapter_exception_mid_stream_becomes_one_terminal_error_chunk() -> None:
    async def body(request: LlmRequest) -> AsyncGenerator[StreamChunk, None]:
        yield TextDeltaChunk(index=0, text="partial")
        raise RuntimeError("socket exploded")

    async with open_host([Row(name="llm")]) as host:
        host.ctx.llm.register_adapter(["fake"], FakeAdapter(body))
        chunks = await collect(host.ctx.llm.stream(request("fake")))
        assert chunks[0] == TextDeltaChunk(index=0, text="partial")
        assert finish_count(chunks) == 1 and len(chunks) == 2
        kind, failure = terminal_failure(chunks)
        assert (kind, failure) == ("error", LlmFailure(message="socket exploded", code="UNKNOWN"))


async def test_failures_before_iteration_are_chunks_too() -> None:
    class Exploding(LlmAdapter):
        def stream(self, request: LlmRequest) -> AsyncIterator[StreamChunk]:
            raise ValueError()

    class BadModel(FakeAdapter):
        async def resolve_model(
            self, provider: str, model: str, signal: CancelToken | None = None
        ) -> ModelInfo:
            raise LlmError("model lookup failed", "MODEL_LOOKUP")

    async with open_host([Row(name="llm")]) as host:
        host.ctx.llm.register_adapter(["boom"], Exploding())
        host.ctx.llm.register_adapter(["lookup"], BadModel(hello()))
        _, failure = terminal_failure(await collect(host.ctx.llm.stream(request("boom"))))
        assert failure == LlmFailure(message="LLM adapter failed", code="UNKNOWN")
        _, failure = terminal_failure(await collect(host.ctx.llm.stream(request("lookup"))))
        assert failure.code == "MODEL_LOOKUP"


async def test_llm_error_facts_survive_the_boundary() -> None:
    async def body(request: LlmRequest) -> AsyncGenerator[StreamChunk, None]:
        raise LlmError(
            "slow down", "RATE_LIMIT", status=429, provider_retry_after_ms=1500.2,
            request_id="req-1",
        )
        yield  # pragma: no cover

    async with open_host([Row(name="llm")]) as host:
        host.ctx.llm.register_adapter(["fake"], FakeAdapter(body))
        kind, failure = terminal_failure(await collect(host.ctx.llm.stream(request("fake"))))
        assert kind == "error"
        assert failure == LlmFailure(
            message="slow down", code="RATE_LIMIT", status=429,
            provider_retry_after_ms=1501, request_id="req-1",
        )
        wire = msgspec.json.encode(failure)
        assert b'"providerRetryAfterMs":1501' in wire and b'"requestId":"req-1"' in wire


async def test_any_failure_while_the_signal_is_aborted_is_an_aborted_finish() -> None:
    token = CancelToken()

    async def body(request: LlmRequest) -> AsyncGenerator[StreamChunk, None]:
        yield TextDeltaChunk(index=0, text="x")
        token.abort("user pressed ctrl-c")
        raise OSError("connection torn down by the abort")

    async with open_host([Row(name="llm")]) as host:
        host.ctx.llm.register_adapter(["fake"], FakeAdapter(body))
        chunks = await collect(host.ctx.llm.stream(request("fake", signal=token)))
        kind, failure = terminal_failure(chunks)
        assert kind == "aborted" and failure.code == "UNKNOWN"


async def test_abort_before_dispatch_never_calls_the_adapter() -> None:
    token = CancelToken()
    token.abort("early")
    async with open_host([Row(name="llm")]) as host:
        adapter = FakeAdapter(hello())
        host.ctx.llm.register_adapter(["fake"], adapter)
        chunks = await collect(host.ctx.llm.stream(request("fake"), signal=token))
        kind, failure = terminal_failure(chunks)
        assert (kind, failure.code) == ("aborted", "ABORTED")
        assert adapter.requests == []


async def test_aborted_error_from_adapter_is_aborted_even_without_signal() -> None:
    async def body(request: LlmRequest) -> AsyncGenerator[StreamChunk, None]:
        raise AbortError("gone")
        yield  # pragma: no cover

    async with open_host([Row(name="llm")]) as host:
        host.ctx.llm.register_adapter(["fake"], FakeAdapter(body))
        kind, failure = terminal_failure(await collect(host.ctx.llm.stream(request("fake"))))
        assert (kind, failure.code) == ("aborted", "ABORTED")


async def test_nothing_follows_finish_and_the_adapter_is_closed() -> None:
    closed: list[str] = []

    async def body(request: LlmRequest) -> AsyncGenerator[StreamChunk, None]:
        try:
            yield FinishChunk(reason=StopFinish())
            yield TextDeltaChunk(index=0, text="after finish")
        finally:
            closed.append("adapter cleanup ran")

    async with open_host([Row(name="llm")]) as host:
        host.ctx.llm.register_adapter(["fake"], FakeAdapter(body))
        chunks = await collect(host.ctx.llm.stream(request("fake")))
        assert chunks == [FinishChunk(reason=StopFinish())]
        assert closed == ["adapter cleanup ran"]


async def test_early_close_runs_adapter_cleanup_and_cleanup_failures_stay_thrown() -> None:
    async def body(request: LlmRequest) -> AsyncGenerator[StreamChunk, None]:
        try:
            while True:
                yield TextDeltaChunk(index=0, text="x")
        finally:
            raise RuntimeError("adapter cleanup failed")

    async with open_host([Row(name="llm")]) as host:
        host.ctx.llm.register_adapter(["fake"], FakeAdapter(body))
        with pytest.raises(RuntimeError, match="adapter cleanup failed"):
            async with aclosing(host.ctx.llm.stream(request("fake"))) as stream:
                async for _chunk in stream:
                    break


async def test_consumer_failures_are_not_converted() -> None:
    async with open_host([Row(name="llm")]) as host:
        host.ctx.llm.register_adapter(["fake"], FakeAdapter(hello()))
        with pytest.raises(KeyError):
            async with aclosing(host.ctx.llm.stream(request("fake"))) as stream:
                async for _chunk in stream:
                    raise KeyError("consumer bug")


async def test_stream_is_lazy_until_first_pull() -> None:
    async with open_host([Row(name="llm")]) as host:
        adapter = FakeAdapter(hello())
        host.ctx.llm.register_adapter(["fake"], adapter)
        stream = host.ctx.llm.stream(request("fake"))
        await anyio.lowlevel.checkpoint()
        assert adapter.requests == []
        await stream.aclose()
        assert adapter.requests == []


async def test_middleware_wraps_reads_frozen_request_and_its_failures_stay_thrown() -> None:
    seen: list[str] = []

    def outer(req: LlmRequest, next_: Callable[[], AsyncIterator[StreamChunk]]) -> Any:
        async def run() -> AsyncGenerator[StreamChunk, None]:
            seen.append(f"before adapter: session={req.session_id}")
            with pytest.raises(dataclasses.FrozenInstanceError):
                req.system = "rewritten"  # type: ignore[misc]
            async with aclosing(next_()) as inner:  # type: ignore[type-var]
                async for chunk in inner:
                    yield chunk
            seen.append("after adapter")

        return run()

    def failing(req: LlmRequest, next_: Callable[[], AsyncIterator[StreamChunk]]) -> Any:
        async def run() -> AsyncGenerator[StreamChunk, None]:
            raise RuntimeError("checkpoint failed")
            yield  # pragma: no cover

        return run()

    class Session:
        id = "s-1"

    async with open_host([Row(name="llm")]) as host:
        adapter = FakeAdapter(hello())
        host.ctx.llm.register_adapter(["fake"], adapter)
        off = host.ctx.on("llm/stream", outer)
        chunks = await collect(host.ctx.llm.stream(request("fake", session=Session())))
        assert finish_count(chunks) == 1
        assert seen == ["before adapter: session=s-1", "after adapter"]
        off()
        host.ctx.on("llm/stream", failing)
        with pytest.raises(RuntimeError, match="checkpoint failed"):
            await collect(host.ctx.llm.stream(request("fake")))
        assert len(adapter.requests) == 1  # the vetoing middleware kept the adapter from running


async def test_middleware_may_serve_an_unrouted_provider() -> None:
    def serve(req: LlmRequest, next_: Callable[[], AsyncIterator[StreamChunk]]) -> Any:
        if req.provider != "virtual":
            return next_()
        return hello("served by middleware")(req)

    async with open_host([Row(name="llm")]) as host:
        host.ctx.on("llm/stream", serve)
        result = await assemble(host.ctx.llm.stream(request("virtual")))
        assert result.blocks() == (TextBlock(text="served by middleware"),)


def _reasoning_info(provider: str, model: str) -> ModelInfo:
    return ModelInfo(
        provider=provider, id=model, name=model, context_window=64_000,
        default_max_tokens=4096, reasoning_efforts=("low", "high"), default_effort="high",
    )


async def test_prepare_call_materializes_adapter_defaults_and_dispatches_once() -> None:
    async with open_host([Row(name="llm")]) as host:
        adapter = FakeAdapter(hello(), info=_reasoning_info)
        host.ctx.llm.register_adapter(["fake"], adapter)
        prepared = await host.ctx.llm.prepare_call(LlmCallConfig(provider="fake", model="m"))
        assert prepared.config == LlmCallConfig(
            provider="fake", model="m", reasoning_effort="high", max_tokens=4096
        )
        assert prepared.adapter_defaults == AdapterDefaults(reasoning_effort=True, max_tokens=True)
        assert prepared.context_window == 64_000
        assert prepared.retry_policy == RetryPolicy()
        req = LlmRequest(config=prepared.config, messages=(user("hi"),))
        with pytest.raises(LlmError, match="config changed before adapter dispatch"):
            prepared.stream(req.replace(config=LlmCallConfig(provider="fake", model="other")))
        chunks = await collect(prepared.stream(req))
        assert finish_count(chunks) == 1
        assert adapter.requests[0].config == prepared.config
        with pytest.raises(LlmError, match="can only be dispatched once") as again:
            prepared.stream(req)
        assert again.value.code == "INVALID_PREPARED_CALL"

        explicit = await host.ctx.llm.prepare_call(
            LlmCallConfig(provider="fake", model="m", reasoning_effort="low", max_tokens=10)
        )
        assert explicit.adapter_defaults == AdapterDefaults()
        with pytest.raises(LlmError) as bad:
            await host.ctx.llm.prepare_call(
                LlmCallConfig(provider="fake", model="m", reasoning_effort="max")
            )
        assert bad.value.code == "UNSUPPORTED_REASONING_EFFORT"


async def test_unprepared_stream_resolves_defaults_and_refuses_unsupported_effort() -> None:
    async with open_host([Row(name="llm")]) as host:
        adapter = FakeAdapter(hello(), info=_reasoning_info)
        plain = FakeAdapter(hello())
        host.ctx.llm.register_adapter(["fake"], adapter)
        host.ctx.llm.register_adapter(["plain"], plain)
        await collect(host.ctx.llm.stream(request("fake")))
        assert adapter.requests[0].config.max_tokens == 4096
        chunks = await collect(host.ctx.llm.stream(request("plain", reasoning_effort="high")))
        _, failure = terminal_failure(chunks)
        assert failure.code == "UNSUPPORTED_REASONING_EFFORT"
        assert plain.requests == []


async def test_replay_state_reaches_only_the_adapter_that_owns_it() -> None:
    async with open_host([Row(name="llm")]) as host:
        owner = FakeAdapter(hello())
        other = FakeAdapter(hello())
        host.ctx.llm.register_adapter(["owner", "owner-alias"], owner)
        host.ctx.llm.register_adapter(["other"], other)
        history = AssistantMessage(
            id="m1",
            content=(TextBlock(text="earlier"),),
            source=ModelSource(provider="owner", model="m", replay_state={"response": "r"}),
        )
        await collect(host.ctx.llm.stream(request("owner-alias", messages=[user("a"), history])))
        await collect(host.ctx.llm.stream(request("other", messages=[user("a"), history])))
        kept = owner.requests[0].messages[1]
        stripped = other.requests[0].messages[1]
        assert isinstance(kept, AssistantMessage) and isinstance(stripped, AssistantMessage)
        assert kept.source.replay_state == {"response": "r"}
        assert stripped.source == ModelSource(provider="owner", model="m")
        assert stripped.id == "m1" and stripped.content == history.content


async def test_replay_state_stripping_follows_a_live_sessions_messages_view() -> None:
    """The runtime indexes a session's derived messages incrementally; what each
    adapter receives must be exactly what a full walk gives: after appends, for an
    older (shorter) snapshot, after a surface replacement, and after a re-route."""
    from dsh_host._session import AssistantMessageData, Session, UserMessage, UserSource

    def said(mid: str, provider: str) -> AssistantMessageData:
        return AssistantMessageData(
            turn=1,
            step=1,
            message=AssistantMessage(
                id=mid,
                content=(TextBlock(text=mid),),
                source=ModelSource(provider=provider, model="m", replay_state={"r": mid}),
            ),
            stream=(),
        )

    def plain_user(mid: str) -> UserMessage:
        return UserMessage(id=mid, content=(TextBlock(text=mid),), source=UserSource())

    def replay(messages: Any) -> list[tuple[str, Any]]:
        return [
            (m.id, m.source.replay_state)
            for m in messages
            if isinstance(m, AssistantMessage)
        ]

    async with open_host([Row(name="llm")]) as host:
        owner = FakeAdapter(hello())
        other = FakeAdapter(hello())
        host.ctx.llm.register_adapter(["owner"], owner)
        registration = host.ctx.llm.register_adapter(["other"], other)
        session = Session.create("s")
        session.append("user/message", plain_user("u0"), surface_op="append")
        session.append("assistant/message", said("a1", "owner"), surface_op="append")

        async def send(provider: str, view: Any) -> LlmRequest:
            adapter = owner if provider == "owner" else other
            req = LlmRequest(
                config=LlmCallConfig(provider=provider, model="m"),
                messages=view,
                session=session,
            )
            assert req.messages is view  # kept as is, not copied
            await collect(host.ctx.llm.stream(req))
            return adapter.requests[-1]

        first = session.derive_messages()
        assert (await send("owner", first)).messages is first  # nothing foreign: untouched
        assert replay((await send("other", first)).messages) == [("a1", UNSET)]
        session.append("assistant/message", said("a2", "other"), surface_op="append")
        second = session.derive_messages()
        assert replay((await send("owner", second)).messages) == [("a1", {"r": "a1"}), ("a2", UNSET)]
        assert replay((await send("other", second)).messages) == [("a1", UNSET), ("a2", {"r": "a2"})]
        # The older snapshot shares the backing list but is shorter.
        assert (await send("owner", first)).messages is first
        # A replacement allocates a new backing list: the index restarts.
        session.append(
            "user/message",
            plain_user("sum"),
            surface_op={"op": "replace", "start": 0, "end": 1},
            source_event_seqs=[0, 1],
        )
        third = session.derive_messages()
        assert [m.id for m in third] == ["sum", "a2"]
        assert replay((await send("owner", third)).messages) == [("a2", UNSET)]
        # Re-routing "other" away strips its replay state for every adapter.
        registration.dispose()
        assert replay((await send("owner", third)).messages) == [("a2", UNSET)]
        assert [m.id for m in owner.requests[-1].messages] == ["sum", "a2"]


async def test_signal_keyword_is_fused_with_the_request_signal() -> None:
    seen: list[CancelToken | None] = []

    async def body(req: LlmRequest) -> AsyncGenerator[StreamChunk, None]:
        seen.append(req.signal)
        yield FinishChunk(reason=StopFinish())

    async with open_host([Row(name="llm")]) as host:
        host.ctx.llm.register_adapter(["fake"], FakeAdapter(body))
        own, extra = CancelToken(), CancelToken()
        await collect(host.ctx.llm.stream(request("fake", signal=own), signal=extra))
        fused = seen[0]
        assert fused is not None and fused is not own and not fused.aborted
        extra.abort("late")
        assert fused.aborted


async def test_assembler_feeds_from_a_live_stream_with_times() -> None:
    async with open_host([Row(name="llm")]) as host:
        host.ctx.llm.register_adapter(["fake"], FakeAdapter(hello("hi")))
        assembler = BlockAssembler()
        async with aclosing(host.ctx.llm.stream(request("fake"))) as stream:
            async for chunk in stream:
                assembler.push(chunk, 1000 + assembler.chunk_count)
        assert len(assembler.stream_records()) == 3
        assert assembler.message(provider="fake", model="m").content == (TextBlock(text="hi"),)


def test_failure_normalization() -> None:
    assert failure_of(AbortError("user")).code == "ABORTED"

    class Coded(DshError):
        code = "SANDBOX_UNAVAILABLE"

    assert failure_of(Coded("no sandbox")) == LlmFailure(
        message="no sandbox", code="SANDBOX_UNAVAILABLE"
    )

    class Foreign(Exception):
        code = "RATE_LIMIT"
        failure = LlmFailure(message="copied", code="RATE_LIMIT", status=429)

    assert failure_of(Foreign("x")) == Foreign.failure

    class Liar(Exception):
        code = "OTHER"
        failure = LlmFailure(message="copied", code="RATE_LIMIT")

    assert failure_of(Liar("third-party text")) == LlmFailure(
        message="third-party text", code="UNKNOWN"
    )

    class SdkError(Exception):
        code = "ECONNRESET"  # a third-party code is not our taxonomy

    assert failure_of(SdkError("reset")).code == "UNKNOWN"


def test_llm_error_validates_its_facts() -> None:
    with pytest.raises(ValueError):
        LlmError("", "X")
    with pytest.raises(ValueError):
        LlmError("m", "")
    with pytest.raises(ValueError):
        LlmError("m", "X", status=99)
    with pytest.raises(ValueError):
        LlmError("m", "X", provider_retry_after_ms=0)
    with pytest.raises(ValueError):
        LlmError("m", "X", request_id="")


def test_retry_policy_delays() -> None:
    policy = RetryPolicy(max_retries=2, jitter_ratio=0)
    server = LlmFailure(message="x", code="SERVER")
    assert policy.delay_ms(1, server) == 500
    assert policy.delay_ms(2, server) == 1000
    assert policy.delay_ms(3, server) is None  # max_retries reached
    assert policy.delay_ms(1, LlmFailure(message="x", code="AUTH")) is None
    limited = LlmFailure(message="x", code="RATE_LIMIT", provider_retry_after_ms=2000)
    assert policy.delay_ms(1, limited) == 2000
    too_long = LlmFailure(message="x", code="RATE_LIMIT", provider_retry_after_ms=60_000)
    assert policy.delay_ms(1, too_long) is None
    always = RetryPolicy(mode="always", jitter_ratio=0)
    assert always.delay_ms(1, too_long) == 500
    assert always.delay_ms(100, LlmFailure(message="x", code="AUTH")) == 10_000
    jittered = RetryPolicy(jitter_ratio=0.5)
    assert jittered.delay_ms(1, server, random=lambda: 0.0) == 250
    assert jittered.delay_ms(1, server, random=lambda: 1.0) == 750
    with pytest.raises(ValueError):
        RetryPolicy(initial_delay_ms=5000, max_delay_ms=10)
    with pytest.raises(ValueError):
        RetryPolicy(retryable_codes=())
