"""Tool-call scheduling for one assistant step, as DSH schedules them.

The model's calls run in model order, grouped: a call whose tool is not
concurrency-safe is a group of one (a barrier); a parallel-safe call opens a
group that takes every following parallel-safe call. Inside a group:

* policy is **ordered**: each call's ``tool/call`` is appended and its
  pre-execute / approval / guard stage (``tools.prepare``) finishes before the
  next call starts, so approvals never overlap;
* only dispatch (``tools/execute`` and the body) overlaps, at most
  ``max_parallel_tool_calls`` at a time;
* results are **committed in model order** (post-execute, ``tools/result``,
  then the ``tool/result`` event citing its ``tool/call``), whatever order the
  bodies finish in; the contexts a result carries are handed to the agent for
  the next step, after every result of the step.

A call whose approval was *deferred* (D19: the ``user-approval`` row's
``defer`` mode and nobody answered) settles without a result: it is skipped
at commit time, the other calls of the step still run and commit, and its id
is handed back so the loop ends the turn ``awaiting-approval``. A call whose *body*
raised :class:`~dsh_host._tools.ToolCallWaits` (it waits on another session's deferred
calls: a sub-agent's child, D36) settles the same way, after an ignorable ``tool/waits
{turn, step, callId, sessionId, callIds}`` naming what it waits on.

Cancellation stops new starts; started calls are drained and committed (a
started body is never abandoned), and every call that never started gets a
``tool/call`` plus a synthetic ``ABORTED_BEFORE_DISPATCH`` result, so the log
stays balanced. A failure of the scheduler itself (not a tool error, which is
always a result) stops new starts, waits for started bodies, and propagates
without fabricating results: the durable ``tool/call`` events without results
are exactly what crash repair answers with ``TOOL_OUTCOME_UNKNOWN``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import anyio
from msgspec import UNSET

from dsh_host._cancel import CancelToken
from dsh_host._session.approvals import WAITS_EVENT
from dsh_host._session.events import ToolCallData, ToolErrorData, ToolResultData
from dsh_host._session.messages import (
    ToolCallBlock,
    ToolResultBlock,
    ToolResultMessage,
    ToolSource,
    UserMessage,
    new_message_id,
)
from dsh_host._tools import (
    ExecutionMode,
    ToolExecution,
    ToolExecutionInput,
    ToolExecutionResult,
    ToolRuntime,
    aborted_before_dispatch_result,
)

if TYPE_CHECKING:
    from dsh_host._session.session import Session

    from .loop import Agent

__all__ = ["append_tool_call", "append_tool_result", "execute_tool_calls", "parse_arguments"]


def parse_arguments(raw: str) -> Any:
    """The model's raw argument string as the tool sees it.

    ``""`` → ``{}``; valid JSON → its value; anything else → the raw string
    itself, so the tool's own validation reports it (usually ``"arguments"
    must be an object``).
    """
    if not raw:
        return {}
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def append_tool_call(session: Session, turn: int, step: int, block: ToolCallBlock) -> int:
    """Append ``tool/call`` (the raw argument string) and return its seq."""
    event = session.append(
        "tool/call",
        ToolCallData(
            turn=turn, step=step, call_id=block.id, name=block.name, arguments=block.arguments
        ),
    )
    return event.seq


def append_tool_result(
    session: Session,
    turn: int,
    step: int,
    call_id: str,
    result: ToolExecutionResult,
    call_seq: int,
) -> None:
    """Append the model-facing ``tool/result`` citing its ``tool/call``."""
    message = ToolResultMessage(
        id=new_message_id(),
        content=(
            ToolResultBlock(tool_call_id=call_id, content=result.content, is_error=result.is_error),
        ),
        source=ToolSource(call_id=call_id),
    )
    info = result.error.info if result.error is not None else None
    data = ToolResultData(
        turn=turn,
        step=step,
        message=message,
        error=ToolErrorData(name=info.name, code=info.code) if info is not None else UNSET,
        meta=result.meta,
    )
    session.append("tool/result", data, surface_op="append", source_event_seqs=[call_seq])


@dataclass(slots=True)
class _Planned:
    block: ToolCallBlock
    input: ToolExecutionInput


@dataclass(slots=True)
class _Slot:
    exec: ToolExecution
    result: ToolExecutionResult | None  # None: deferred (no result until a decision)
    needs_post: bool


@dataclass(slots=True)
class _GroupOutcome:
    consumed: int
    aborted: bool
    concluded: bool


class _Group:
    """One barrier or parallel pool; see the module docstring for the rules."""

    def __init__(
        self,
        *,
        tools: ToolRuntime,
        session: Session,
        turn: int,
        step: int,
        calls: Sequence[_Planned],
        mode: ExecutionMode,
        signal: CancelToken,
        cap: int,
        accept_context: Callable[[UserMessage], None],
        deferred: list[str],
    ) -> None:
        self.deferred = deferred
        self.tools = tools
        self.session = session
        self.turn = turn
        self.step = step
        self.calls = calls
        self.mode = mode
        self.signal = signal
        self.cap = max(1, cap)
        self.accept_context = accept_context
        self.slots: list[_Slot | None] = [None] * len(calls)
        self.call_seqs: list[int] = [-1] * len(calls)
        self.next_to_start = 0
        self.committed = 0
        self.started = 0
        self.aborted = signal.aborted
        self.concluded = False
        self.failure: BaseException | None = None
        self.in_flight: set[int] = set()

    def _raise_failure(self) -> None:
        if self.failure is not None:
            raise self.failure

    async def _settle(self) -> None:
        """After a call started or a body ended: commit what is ready, in order, and note an
        abort that landed meanwhile (a scheduler failure is raised before and after)."""
        self._raise_failure()
        await self._commit_ready()
        self._raise_failure()
        if self.signal.aborted:
            self.aborted = True

    async def run(self) -> _GroupOutcome:
        if len(self.calls) == 1:
            return await self._run_one()
        send, receive = anyio.create_memory_object_stream[int](len(self.calls))
        error: BaseException | None = None
        async with send, receive, anyio.create_task_group() as dispatches:
            try:
                await self._fill(dispatches, send)
                while self.in_flight:
                    index = await receive.receive()
                    self.in_flight.discard(index)
                    await self._settle()
                    await self._fill(dispatches, send)
            except Exception as exc:
                # Stop starting; the task group's exit waits for every started
                # body (they are never cancelled by a scheduler failure).
                error = self.failure or exc
        if error is not None:
            raise error
        return self._outcome()

    async def _run_one(self) -> _GroupOutcome:
        """:meth:`run` for a group of one call (an exclusive call, or a lone parallel one).

        The same steps in the same order, but the body is awaited here (:meth:`_start`
        with no task group), and :meth:`_fill` settles it as it settles a started call:
        with nothing to overlap it with, a task group, a dispatch task and a result stream
        per step would only cost time (about a tenth of an in-memory step). The body still
        runs under the caller's cancel scopes, and a scheduler failure still propagates
        after it settled.
        """
        error: BaseException | None = None
        try:
            await self._fill(None, None)
        except Exception as exc:
            error = self.failure or exc
        if error is not None:
            raise error
        return self._outcome()

    def _outcome(self) -> _GroupOutcome:
        if self.aborted:
            for planned in self.calls[self.started :]:
                _append_skipped(self.session, self.turn, self.step, planned.block)
            return _GroupOutcome(len(self.calls), True, self.concluded)
        if self.committed != self.started:  # pragma: no cover - invariant
            raise RuntimeError("tool-call scheduler: settled calls were left uncommitted")
        return _GroupOutcome(self.started, False, self.concluded)

    async def _fill(self, dispatches: Any, send: Any) -> None:
        while (
            not self.aborted
            and self.next_to_start < len(self.calls)
            and len(self.in_flight) < self.cap
        ):
            index = self.next_to_start
            if (
                index > 0
                and self.mode == "parallel"
                and self.tools.execution_mode(self.calls[index].input) != "parallel"
            ):
                break  # an exclusive call becomes the next group's barrier
            await self._start(index, dispatches, send)
            self.next_to_start += 1
            await self._settle()  # an abort may land while pre-execute awaits

    async def _start(self, index: int, dispatches: Any, send: Any) -> None:
        planned = self.calls[index]
        self.call_seqs[index] = append_tool_call(self.session, self.turn, self.step, planned.block)
        self.started += 1
        prepared = await self.tools.prepare(planned.input)
        self._raise_failure()
        if prepared.kind == "dispatch":
            if dispatches is None:  # a group of one (_run_one): the body runs in this task
                await self._dispatch(index, prepared.exec, None)
                return
            self.in_flight.add(index)
            dispatches.start_soon(self._dispatch, index, prepared.exec, send)
        elif prepared.kind == "deferred":
            self.slots[index] = _Slot(prepared.exec, None, False)
        else:
            assert prepared.result is not None
            self.slots[index] = _Slot(
                prepared.exec, prepared.result, prepared.kind == "post-result"
            )

    async def _dispatch(self, index: int, execution: ToolExecution, send: Any) -> None:
        try:
            outcome = await self.tools.dispatch(execution)
            if outcome.kind == "deferred" and outcome.waits is not None:
                # The body waits on another session's deferred calls (D36): the evidence
                # repair and `dsh approvals` read, and no result until the session continues.
                self.session.append(
                    WAITS_EVENT,
                    {
                        "turn": self.turn,
                        "step": self.step,
                        "callId": execution.call_id,
                        "sessionId": outcome.waits.session_id,
                        "callIds": list(outcome.waits.call_ids),
                    },
                    ignorable=True,
                )
                self.slots[index] = _Slot(execution, None, False)
                return
            self.slots[index] = _Slot(execution, outcome.result, outcome.kind == "post-result")
        except Exception as exc:
            if self.failure is None:
                self.failure = exc
        finally:
            if send is not None:
                send.send_nowait(index)

    async def _commit_ready(self) -> None:
        while self.committed < len(self.calls):
            slot = self.slots[self.committed]
            if slot is None:
                return
            planned = self.calls[self.committed]
            if slot.result is None:  # deferred: it stays without a result for now
                self.deferred.append(planned.block.id)
                self.committed += 1
                continue
            if slot.needs_post:
                result = await self.tools.finalize(slot.exec, slot.result)
            else:
                result = self.tools.finish(slot.exec, slot.result)
            append_tool_result(
                self.session,
                self.turn,
                self.step,
                planned.block.id,
                result,
                self.call_seqs[self.committed],
            )
            for context in result.additional_contexts:
                self.accept_context(context)
            self.concluded = self.concluded or result.concludes_turn
            self.committed += 1


def _append_skipped(session: Session, turn: int, step: int, block: ToolCallBlock) -> None:
    """The durable call/result pair of a call that cancellation kept from starting."""
    call_seq = append_tool_call(session, turn, step, block)
    append_tool_result(session, turn, step, block.id, aborted_before_dispatch_result(), call_seq)


async def execute_tool_calls(
    agent: Agent,
    tools: ToolRuntime,
    turn: int,
    step: int,
    blocks: Sequence[ToolCallBlock],
    signal: CancelToken,
    accept_context: Callable[[UserMessage], None],
    *,
    max_parallel: int,
    deferred: list[str] | None = None,
    decisions: Mapping[str, Literal["allowed-once", "rejected"]] | None = None,
) -> bool:
    """Run one step's tool calls; returns True when a committed success concluded the turn.

    On cancellation it returns normally with every call answered (the caller
    sees the aborted token); a scheduler failure raises. With ``deferred`` the
    calls may have their approval deferred: their ids are appended to it and
    they get no result. ``decisions`` maps call ids to the decision recorded
    for them earlier (the calls a continued turn applies).
    """
    recorded = decisions or {}
    planned = [
        _Planned(
            block,
            ToolExecutionInput(
                call_id=block.id,
                name=block.name,
                arguments=parse_arguments(block.arguments),
                raw_arguments=block.arguments,
                agent=agent,
                signal=signal,
                deferrable=deferred is not None,
                approval_decision=recorded.get(block.id),
            ),
        )
        for block in blocks
    ]
    position = 0
    concluded = False
    while position < len(planned):
        first = planned[position]
        # The last call is a group of one whatever its mode: no classifier to run, no schema
        # to check twice (the body's own validation still runs) for a step's lone call (D49).
        last = position == len(planned) - 1
        mode = "exclusive" if last else tools.execution_mode(first.input)
        calls = planned[position:] if mode == "parallel" else [first]
        outcome = await _Group(
            tools=tools,
            session=agent.session,
            turn=turn,
            step=step,
            calls=calls,
            mode=mode,
            signal=signal,
            cap=max_parallel,
            accept_context=accept_context,
            deferred=deferred if deferred is not None else [],
        ).run()
        position += outcome.consumed
        concluded = concluded or outcome.concluded
        if outcome.aborted:
            for skipped in planned[position:]:
                _append_skipped(agent.session, turn, step, skipped.block)
            return concluded
    return concluded
