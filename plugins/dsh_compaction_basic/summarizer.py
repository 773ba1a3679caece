"""The one-shot summary request and the checkpoint framing (DSH's exact texts)."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, Final

from msgspec import UNSET

from dsh_host.sdk import (
    AbortedFinish,
    BlockAssembler,
    CancelToken,
    ContentBlock,
    ErrorFinish,
    ImageBlock,
    LlmCallConfig,
    LlmError,
    LlmRequest,
    MaxTokensFinish,
    Message,
    PluginSource,
    TextBlock,
    TokenUsage,
    ToolSchema,
    UserMessage,
    new_message_id,
)

__all__ = [
    "CHECKPOINT_PREAMBLE",
    "COMPACTION_INSTRUCTION",
    "SUMMARY_CLOSE_TAG",
    "SUMMARY_OPEN_TAG",
    "SummaryResult",
    "frame_summary",
    "summarize_with_llm",
]

SUMMARY_OPEN_TAG: Final = "<compacted-summary>"
SUMMARY_CLOSE_TAG: Final = "</compacted-summary>"

#: The summary directive: the FINAL user message after the replayed conversation, so the
#: auxiliary call is a prefix of the conversation's last request (its KV cache is reused).
COMPACTION_INSTRUCTION: Final = "\n".join(
    [
        "You are now acting as a compaction engine for this AI coding assistant. Condense the "
        "conversation ABOVE into a structured checkpoint that lets another model resume the "
        "work with no loss of essential context.",
        "",
        "Output EXACTLY the Markdown structure below: keep every section, in order. Use terse "
        'bullets, not prose paragraphs. Write "(none)" for an empty section — never drop a '
        "section.",
        "",
        "## Primary Request and Intent",
        "- [the user's original and evolving goals; quote verbatim where the exact wording "
        "matters]",
        "",
        "## Key Technical Concepts",
        "- [technologies, frameworks, patterns, and conventions in play]",
        "",
        "## Files and Code",
        "- [exact path: why it matters, key changes or snippets]",
        "",
        "## Errors and Fixes",
        "- [error: how it was resolved, plus any related user feedback]",
        "",
        "## Pending Jobs",
        "- [explicitly requested work not yet completed]",
        "",
        "## Current Work",
        "- [precisely what was in progress at this checkpoint]",
        "",
        "## Next Step",
        '- [the single next action, directly in line with the most recent request, or "(none)"]',
        "",
        "## Critical Context",
        "- [decisions and their rationale, constraints, user preferences, open questions, data "
        "needed to continue]",
        "",
        "Rules:",
        "- Write concise English engineering prose. Preserve exact file paths, commands, error "
        "strings, identifiers, numeric values, function signatures, and syntax fragments.",
        "- Capture user feedback and explicit instructions faithfully, especially corrections.",
        "- Do NOT mention this summarization request or that the context was compacted.",
        "- Output only the checkpoint text: do not call any tool or take any other action.",
        f"- If the conversation already contains a {SUMMARY_OPEN_TAG} block, it is a PRIOR "
        "checkpoint. Do not copy it forward verbatim: preserve still-true facts, drop stale "
        "ones, and merge newer information into a single consolidated summary under the same "
        "structure.",
    ]
)

#: Framing that makes the replacement user message established context.
CHECKPOINT_PREAMBLE: Final = (
    "This is an automatically generated checkpoint condensing an earlier span of the "
    "conversation to free up context. Treat the captured context as established background "
    "and build on it without restating it. Continue the task directly from the messages that "
    "follow, without acknowledging this checkpoint."
)

#: ``source.plugin`` of the instruction message (DSH's).
INSTRUCTION_SOURCE: Final = "dsh-compaction-basic"


@dataclass(frozen=True, slots=True)
class SummaryResult:
    """The safe summary plus the call facts ``compaction/summary`` records."""

    summary: tuple[TextBlock, ...]
    raw_output: tuple[ContentBlock, ...]
    provider: str
    model: str
    max_tokens: int
    usage: TokenUsage | None


def frame_summary(summary: Sequence[TextBlock]) -> tuple[TextBlock, ...]:
    """The checkpoint content: preamble and open tag, the summary, the close tag."""
    return (
        TextBlock(text=f"{CHECKPOINT_PREAMBLE}\n\n{SUMMARY_OPEN_TAG}"),
        *summary,
        TextBlock(text=SUMMARY_CLOSE_TAG),
    )


async def summarize_with_llm(
    llm: Any,
    *,
    provider: str,
    model: str,
    max_tokens: int,
    messages: Sequence[Message],
    tools: Sequence[ToolSchema],
    session: Any,
    signal: CancelToken | None,
) -> SummaryResult:
    """One ``llm/stream`` call replaying ``messages`` then the instruction (purpose compaction).

    The request names the live session, so the checkpoint policy flushes before it leaves the
    machine, like any other model request.
    """
    instruction = UserMessage(
        id=new_message_id(),
        content=(TextBlock(text=COMPACTION_INSTRUCTION),),
        source=PluginSource(plugin=INSTRUCTION_SOURCE),
    )
    request = LlmRequest(
        config=LlmCallConfig(provider=provider, model=model, max_tokens=max_tokens),
        messages=(*messages, instruction),
        tools=tuple(tools),
        signal=signal,
        session=session,
        purpose="compaction",
    )
    assembler = BlockAssembler()
    async with aclosing(llm.stream(request)) as chunks:
        async for chunk in chunks:
            assembler.push(chunk)
    finish = assembler.finish
    if isinstance(finish, ErrorFinish | AbortedFinish):
        if signal is not None:
            signal.throw_if_aborted()
        raise LlmError(finish.failure.message, finish.failure.code)
    if isinstance(finish, MaxTokensFinish):
        raise LlmError(
            "summarization truncated at the token cap (incomplete checkpoint)", "MAX_TOKENS"
        )
    raw = assembler.blocks()
    if any(isinstance(block, ImageBlock) for block in raw):
        raise LlmError("compaction summary cannot contain image output", "UNSUPPORTED_CONTENT")
    summary = tuple(block for block in raw if isinstance(block, TextBlock))
    if not any(block.text.strip() for block in summary):
        raise LlmError("summarization produced no text summary content", "EMPTY_SUMMARY")
    return SummaryResult(
        summary=summary,
        raw_output=raw,
        provider=provider,
        model=model,
        max_tokens=max_tokens,
        usage=assembler.usage,
    )


def header_tools(header: Any) -> tuple[ToolSchema, ...]:
    """The tool schemas of a request header (none when absent)."""
    if header is None or header.tools is UNSET:
        return ()
    return tuple(header.tools)
