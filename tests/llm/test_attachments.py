"""Images and PDFs in a user's prompt: the block each file becomes (DSH's shape, bytes in the
log), the limits with their errors, each adapter's native form on the wire (over real HTTP on
127.0.0.1), and the token estimate of an attachment."""

from __future__ import annotations

import base64
import hashlib
import json
import zlib
from pathlib import Path
from typing import Any

import msgspec
import pytest

from dsh_host import Agent, Row, open_host
from dsh_host._llm.attachments import (
    MAX_IMAGE_BYTES,
    AttachmentError,
    attachment_block,
    attachment_blocks,
)
from dsh_host._llm.vision import family_takes_images
from dsh_host._session import ImageBlock, TextBlock
from dsh_host._session.messages import (
    AssistantMessage,
    ErrorFinish,
    FinishChunk,
    ModelSource,
    StreamChunk,
    ToolCallBlock,
    ToolResultBlock,
    ToolResultMessage,
    ToolSource,
    UserMessage,
    UserSource,
    new_message_id,
)
from dsh_host._session.tokens import BLOCK_OVERHEAD, IMAGE_TOKENS, estimate_content

from .llm_helpers import collect, request, terminal_failure
from .provider_wires import WIRES, Wire
from .sse_server import SseServer

KEY_ENV = "DSH_TEST_ATTACH_KEY"


def seeing(wire: Wire, url: str) -> dict[str, Any]:
    """The wire's row, its model declared to read images (DeepSeek's chat model does not)."""
    return {**wire.row_config(url, KEY_ENV), "vision": True}


def png(width: int = 2, height: int = 2) -> bytes:
    """A real (tiny, valid) PNG."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data) & 0xFFFFFFFF
        return len(data).to_bytes(4, "big") + kind + data + crc.to_bytes(4, "big")

    header = width.to_bytes(4, "big") + height.to_bytes(4, "big") + bytes([8, 2, 0, 0, 0])
    rows = b"".join(b"\x00" + b"\xff\x00\x00" * width for _ in range(height))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows))
            + chunk(b"IEND", b""))


PDF = b"%PDF-1.4\n1 0 obj << /Type /Catalog >> endobj\ntrailer << /Root 1 0 R >>\n%%EOF\n"


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    image = tmp_path / "red.png"
    image.write_bytes(png())
    document = tmp_path / "spec.pdf"
    document.write_bytes(PDF)
    return image, document


def test_a_file_becomes_dshs_block_with_its_bytes_in_the_record(
    files: tuple[Path, Path], tmp_path: Path
) -> None:
    image, document = files
    block = attachment_block(image)
    assert isinstance(block, ImageBlock)
    record = dict(block.attachment)
    assert record == {
        "attachmentId": "sha256-" + hashlib.sha256(png()).hexdigest(),
        "mediaType": "image/png",
        "bytes": len(png()),
        "name": "red.png",
        "data": base64.b64encode(png()).decode(),
    }
    file_block: Any = attachment_block(document)
    assert file_block["type"] == "file"
    assert file_block["attachment"]["mediaType"] == "application/pdf"
    assert file_block["attachment"]["name"] == "spec.pdf"
    # the content decides, not the name
    renamed = tmp_path / "notes.txt"
    renamed.write_bytes(png())
    assert isinstance(attachment_block(renamed), ImageBlock)


def test_each_refusal_names_the_file_and_what_to_do(tmp_path: Path) -> None:
    text = tmp_path / "notes.txt"
    text.write_text("just text")
    with pytest.raises(AttachmentError, match=r"notes.txt'.*not an accepted type.*PNG"):
        attachment_block(text)
    with pytest.raises(AttachmentError, match="no such file"):
        attachment_block(tmp_path / "missing.png")
    with pytest.raises(AttachmentError, match="is a directory"):
        attachment_block(tmp_path)
    big = tmp_path / "big.png"
    big.write_bytes(png() + b"\0" * MAX_IMAGE_BYTES)
    with pytest.raises(AttachmentError, match=r"big.png'.*5.0 MiB limit for an image.*scale"):
        attachment_block(big)
    pages = tmp_path / "many.pdf"
    pages.write_bytes(PDF + b"\0" * (10 * 1024 * 1024))
    with pytest.raises(AttachmentError, match=r"10\.0 MiB limit for a PDF"):
        attachment_block(pages)
    parts = []
    for n in range(3):
        part = tmp_path / f"part{n}.pdf"
        part.write_bytes(PDF + b"\0" * (8 * 1024 * 1024))
        parts.append(part)
    with pytest.raises(AttachmentError, match=r"20\.0 MiB limit for one prompt"):
        attachment_blocks(parts)


def test_an_image_costs_its_estimate_not_its_base64(tmp_path: Path) -> None:
    """A 1 MiB image carried as base64 in the log must not count as 350k tokens."""
    big = tmp_path / "photo.png"
    big.write_bytes(png() + b"\0" * 1024 * 1024)
    assert estimate_content([attachment_block(big)]) == IMAGE_TOKENS + BLOCK_OVERHEAD


# -- each adapter's native form --------------------------------------------------------------


def _native(wire: Wire, body: dict[str, Any]) -> list[Any]:
    """The content parts of the request's (only) user message, per wire."""
    if wire.id == "anthropic":
        return list(body["messages"][0]["content"])
    if wire.id == "openai-responses":
        return list(body["input"][0]["content"])
    [parts] = [m["content"] for m in body["messages"] if isinstance(m["content"], list)]
    return list(parts)


def _expected(wire: Wire) -> list[Any]:
    image_uri = "data:image/png;base64," + base64.b64encode(png()).decode()
    pdf_b64 = base64.b64encode(PDF).decode()
    pdf_uri = "data:application/pdf;base64," + pdf_b64
    if wire.id == "anthropic":
        return [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": base64.b64encode(png()).decode()}},
            {"type": "document", "source": {"type": "base64", "media_type": "application/pdf",
                                            "data": pdf_b64}},
            {"type": "text", "text": "what is this?", "cache_control": {"type": "ephemeral"}},
        ]
    if wire.id == "openai-responses":
        return [
            {"type": "input_text", "text": "what is this?"},
            {"type": "input_image", "image_url": image_uri},
            {"type": "input_file", "filename": "spec.pdf", "file_data": pdf_uri},
        ]
    return [
        {"type": "text", "text": "what is this?"},
        {"type": "image_url", "image_url": {"url": image_uri}},
        {"type": "file", "file": {"filename": "spec.pdf", "file_data": pdf_uri}},
    ]


async def _stream(
    wire: Wire, messages: list[Any], *, vision: bool = True
) -> tuple[list[StreamChunk], list[Any]]:
    """One request of ``messages`` to the wire's adapter (its model's ``vision`` set) over
    loopback HTTP: the chunks, and the requests the server received."""
    with SseServer([wire.text(["A red square."], usage=(5, 3, 0))]) as server:
        rows = [Row(name="llm"), Row(id="model", name=wire.plugin, config={
            **wire.row_config(server.url, KEY_ENV), "vision": vision})]
        async with open_host(rows) as host:
            chunks = await collect(host.ctx.llm.stream(
                request(wire.provider, wire.model, messages=messages)
            ))
        return chunks, list(server.requests)


def _prompt(files: tuple[Path, Path]) -> UserMessage:
    return UserMessage(
        id=new_message_id(),
        content=(TextBlock(text="what is this?"), *attachment_blocks(files)),
        source=UserSource(),
    )


@pytest.mark.anyio
@pytest.mark.parametrize("wire", WIRES, ids=[wire.id for wire in WIRES])
async def test_each_adapter_sends_images_and_pdfs_natively(
    wire: Wire, files: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_ENV, "k")
    _, [sent] = await _stream(wire, [_prompt(files)])
    assert _native(wire, sent.body) == _expected(wire)


@pytest.mark.anyio
@pytest.mark.parametrize("wire", WIRES, ids=[wire.id for wire in WIRES])
async def test_an_attachment_without_its_bytes_is_refused_before_any_request(
    wire: Wire, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A DSH attachment reference (bytes in DSH's store, not in the log) is never dropped
    silently: the request fails before any I/O, saying what to do."""
    monkeypatch.setenv(KEY_ENV, "k")
    reference = msgspec.json.decode(
        b'{"attachmentId": "att_1", "mediaType": "image/png", "name": "x.png"}'
    )
    message = UserMessage(id=new_message_id(), content=(
        TextBlock(text="look"), ImageBlock(attachment=reference),
    ), source=UserSource())
    chunks, sent = await _stream(wire, [message])
    assert sent == []
    _, failure = terminal_failure(chunks)
    assert failure.code == "UNSUPPORTED_CONTENT"
    assert "'att_1' has no bytes in the log" in failure.message
    assert "attach the file again" in failure.message


def _tool_turn(image: Path) -> list[Any]:
    """Two parallel calls answered in two tool-result messages, the first with an image."""
    calls = AssistantMessage(
        id=new_message_id(),
        content=(ToolCallBlock(id="c1", name="read_file", arguments='{"path": "red.png"}'),
                 ToolCallBlock(id="c2", name="read_file", arguments='{"path": "a.txt"}')),
        source=ModelSource(provider="p", model="m"),
    )
    shown = ToolResultBlock(tool_call_id="c1", content=(
        TextBlock(text="<type>image</type>"), attachment_block(image),
    ))
    plain = ToolResultBlock(tool_call_id="c2", content=(TextBlock(text="1: text"),))
    return [
        UserMessage(id=new_message_id(), content=(TextBlock(text="look"),), source=UserSource()),
        calls,
        ToolResultMessage(id=new_message_id(), content=(shown,), source=ToolSource(call_id="c1")),
        ToolResultMessage(id=new_message_id(), content=(plain,), source=ToolSource(call_id="c2")),
    ]


def _tool_result_wire(wire: Wire, body: dict[str, Any]) -> list[Any]:
    """What the request says after the assistant's calls, per wire."""
    if wire.id == "anthropic":
        return list(body["messages"][2:])
    if wire.id == "openai-responses":
        return [item for item in body["input"] if item.get("type") == "function_call_output"]
    messages = list(body["messages"])
    calls = next(i for i, m in enumerate(messages) if m.get("tool_calls"))
    return messages[calls + 1:]


def _expected_tool_result(wire: Wire) -> list[Any]:
    data = base64.b64encode(png()).decode()
    uri = "data:image/png;base64," + data
    if wire.id == "anthropic":
        return [{"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "c1", "content": [
                {"type": "text", "text": "<type>image</type>"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                             "data": data}},
            ]},
            {"type": "tool_result", "tool_use_id": "c2", "content": "1: text",
             "cache_control": {"type": "ephemeral"}},
        ]}]
    if wire.id == "openai-responses":
        return [
            {"type": "function_call_output", "call_id": "c1", "output": [
                {"type": "input_text", "text": "<type>image</type>"},
                {"type": "input_image", "image_url": uri},
            ]},
            {"type": "function_call_output", "call_id": "c2", "output": "1: text"},
        ]
    return [  # every call answered first, then the images in one user message
        {"role": "tool", "tool_call_id": "c1",
         "content": "<type>image</type>\n[1 image of this result follows in the next user message]"},
        {"role": "tool", "tool_call_id": "c2", "content": "1: text"},
        {"role": "user", "content": [
            {"type": "text", "text": "Images of tool call c1:"},
            {"type": "image_url", "image_url": {"url": uri}},
        ]},
    ]


@pytest.mark.anyio
@pytest.mark.parametrize("wire", WIRES, ids=[wire.id for wire in WIRES])
async def test_each_adapter_sends_a_tool_results_image_natively(
    wire: Wire, files: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_ENV, "k")
    chunks, [sent] = await _stream(wire, _tool_turn(files[0]))
    assert isinstance(chunks[-1], FinishChunk) and not isinstance(chunks[-1].reason, ErrorFinish)
    assert _tool_result_wire(wire, sent.body) == _expected_tool_result(wire)


@pytest.mark.anyio
async def test_a_pdf_inside_a_tool_result_is_still_refused(
    files: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """No tool makes a document block; one in a tool result is refused, never dropped."""
    monkeypatch.setenv(KEY_ENV, "k")
    wire = WIRES[0]
    result = ToolResultBlock(tool_call_id="c1", content=(attachment_block(files[1]),))
    message = UserMessage(id=new_message_id(), content=(result,), source=UserSource())
    chunks, sent = await _stream(wire, [message])
    assert sent == []
    _, failure = terminal_failure(chunks)
    assert failure.code == "UNSUPPORTED_CONTENT" and "tool result" in failure.message


@pytest.mark.anyio
async def test_agent_run_with_attachments_logs_them_and_sends_them(
    files: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_ENV, "k")
    wire = WIRES[0]
    with SseServer([wire.text(["A red square."], usage=(5, 3, 0))]) as server:
        async with Agent(
            f"openai-compatible:{wire.model}", store=None,
            config={"model": seeing(wire, server.url)},
        ) as agent:
            result = await agent.run("what is this?", attachments=files)
            [logged] = [e.data for e in agent.session.events
                        if e.type == "user/message" and isinstance(e.data.source, UserSource)]
        [sent] = server.requests
    assert result.output == "A red square."
    assert logged.content[0] == TextBlock(text="what is this?")
    assert isinstance(logged.content[1], ImageBlock)
    assert logged.content[1].attachment["mediaType"] == "image/png"
    assert dict(logged.content[2])["type"] == "file"
    assert _native(wire, sent.body) == _expected(wire)


@pytest.mark.anyio
async def test_agent_run_refuses_a_bad_attachment_before_logging_anything(
    tmp_path: Path,
) -> None:
    bad = tmp_path / "notes.txt"
    bad.write_text("text")
    async with Agent("demo", store=None) as agent:
        with pytest.raises(AttachmentError, match="not an accepted type"):
            await agent.run("look", attachments=[bad])
        assert [e for e in agent.session.events if e.type == "user/message"
                and isinstance(e.data.source, UserSource)] == []


# -- a model that takes no images (D31) ------------------------------------------------------


def test_model_families_that_take_no_images() -> None:
    for text_only in ("deepseek-chat", "deepseek-reasoner", "gpt-3.5-turbo", "o3-mini",
                      "claude-2.1", "openai/gpt-3.5-turbo", "qwen2.5-72b-instruct"):
        assert not family_takes_images(text_only), text_only
    for seeing_model in ("claude-sonnet-4-5", "gpt-5-mini", "openai/gpt-4o-mini", "gpt-4.1",
                         "deepseek-vl2", "qwen2.5-vl-72b-instruct", "gemini-2.5-pro", "mystery"):
        assert family_takes_images(seeing_model), seeing_model


@pytest.mark.anyio
@pytest.mark.parametrize("wire", WIRES, ids=[wire.id for wire in WIRES])
async def test_a_model_without_vision_reads_a_note_for_a_tool_results_image(
    wire: Wire, files: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``vision: false`` on the row: the request goes out (the turn does not die) with a text
    note where the image was; the history keeps the image."""
    monkeypatch.setenv(KEY_ENV, "k")
    history = _tool_turn(files[0])
    chunks, [sent] = await _stream(wire, history, vision=False)
    assert isinstance(chunks[-1], FinishChunk) and not isinstance(chunks[-1].reason, ErrorFinish)
    body = json.dumps(sent.body)
    assert base64.b64encode(png()).decode() not in body
    assert (f'[image not shown: red.png (image/png, {len(png())} bytes); model \\"{wire.model}\\" '
            "takes no images or documents.") in body
    assert isinstance(history[2].content[0].content[1], ImageBlock)  # the caller's copy


@pytest.mark.anyio
async def test_a_prompt_with_images_for_a_model_without_vision_is_refused_before_logging(
    files: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """DeepSeek's chat model reads no images (its family's default): the prompt is refused,
    naming the model and what to do, before anything is logged or sent."""
    monkeypatch.setenv(KEY_ENV, "k")
    wire = WIRES[0]
    assert wire.model == "deepseek-chat"
    with SseServer([wire.text(["never"], usage=(1, 1, 0))]) as server:
        async with Agent(
            f"openai-compatible:{wire.model}", store=None,
            config={"model": wire.row_config(server.url, KEY_ENV)},
        ) as agent:
            with pytest.raises(AttachmentError) as refused:
                await agent.run("what is this?", attachments=files)
            logged = [e for e in agent.session.events if e.type == "user/message"]
        assert server.requests == []
    message = str(refused.value)
    assert 'model "deepseek-chat" (provider "deepseek-official") takes no images or documents'\
        in message
    assert "red.png (image/png, " in message and "spec.pdf (application/pdf, " in message
    assert "set `vision: true` on its model row" in message
    assert logged == []
