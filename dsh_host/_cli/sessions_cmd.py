"""``dsh sessions list | show | verify | export | fork``: read stored sessions without writing a
byte to them (``fork`` writes only the new child session)."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import anyio
import msgspec

from .._composition_edits import services_of
from .._loader import LocatedRow, PluginHost, prepared_plugin
from .._persistence.keys import SESSION_PERSISTENCE
from .._persistence.persistence import (
    SessionLoad,
    SessionPersistenceCorruptionError,
    UnreadableListing,
)
from .._session.events import SessionEvent, event_to_builtins, to_builtins
from .._session.keys import TELEMETRY
from .._session.messages import Message
from .._session.prices import PriceTable
from ..errors import install_hint
from .common import (
    CliUsageError,
    load_composition,
    persistence,
    persistence_rows,
    run_with_host,
)
from .flags import add_config_flag, add_root_flag
from .hints import command_hint
from .list_cache import ListCache, listing_key
from .output import console, json_line, progress
from .render import (
    MAX_TOOL_OUTPUT_LINES,
    event_summary,
    human_size,
    iter_transcript_lines,
    message_lines,
    terminal_safe,
    transcript_lines,
    usage_lines,
    when,
)
from .usage import price_table, usage_line


def _session_command(commands: Any, name: str, *, help: str) -> argparse.ArgumentParser:
    """``dsh sessions NAME ID``: a subcommand on one stored session, with the flags that choose
    the store (``--config``, ``--root``) every such subcommand takes."""
    parser: argparse.ArgumentParser = commands.add_parser(name, help=help)
    parser.add_argument("session_id", metavar="ID")
    add_config_flag(parser)
    add_root_flag(parser)
    return parser


def add_parser(sub: Any) -> None:
    sessions = sub.add_parser(
        "sessions", help="list, show, verify, export and fork stored sessions"
    )
    commands = sessions.add_subparsers(dest="sessions_command", metavar="SUBCOMMAND")
    sessions.set_defaults(handler=lambda args: _usage(sessions))

    listing = commands.add_parser("list", help="every stored session, newest first")
    add_config_flag(listing)
    add_root_flag(listing)
    listing.add_argument("--json", action="store_true", help="one JSON object per line")
    listing.add_argument(
        "--fresh",
        action="store_true",
        help="read every log again instead of reusing the summaries remembered for logs that "
        "have not changed since the last listing (~/.cache/dsh/sessions-list.json)",
    )
    listing.set_defaults(handler=run_list)

    show = _session_command(commands, "show", help="print one session")
    show.add_argument(
        "--view",
        choices=("transcript", "model", "events"),
        default="transcript",
        help="transcript: everything that happened, for people (default); model: the surface "
        "the model sees; events: every stored event",
    )
    show.add_argument("--json", action="store_true", help="one JSON object per line")
    show.add_argument(
        "--full", action="store_true",
        help=f"transcript: every line of tool output (default: the first {MAX_TOOL_OUTPUT_LINES})",
    )
    show.add_argument("--turn", type=int, metavar="N", help="transcript: only turn N")
    show.add_argument(
        "--tree",
        action="store_true",
        help="transcript: also print every sub-agent's child session, nested (D24)",
    )
    show.set_defaults(handler=run_show)

    migrate = _session_command(
        commands,
        "migrate",
        help="publish a v3 JSONL session as DSH's format v4 (session.v4.jsonl beside the "
        "untouched v3 file, which stays as the backup)",
    )
    migrate.add_argument(
        "--to", required=True, choices=("v4",), help="the format to migrate to (only v4)"
    )
    migrate.add_argument("--json", action="store_true", help="print one JSON object")
    migrate.set_defaults(handler=run_migrate)

    verify = _session_command(
        commands,
        "verify",
        help="check a stored log without writing: 0 intact, 1 recoverable, 2 corrupt, 3 held "
        "by a live writer",
    )
    verify.add_argument("--json", action="store_true", help="print one JSON object")
    verify.set_defaults(handler=run_verify)

    export = _session_command(
        commands,
        "export",
        help="write one session's events as an attested export (hash chain + Ed25519 "
        "signature) that `dsh audit verify` checks offline",
    )
    export.add_argument(
        "--attest", action="store_true", required=True,
        help="chain every record with SHA-256 and sign the last hash with Ed25519 (required: "
        "the only export form so far)",
    )
    export.add_argument(
        "--key", metavar="FILE",
        help="Ed25519 signing key, PKCS#8 PEM (default: ~/.config/dsh/audit-ed25519.pem, "
        "created 0600 on first use)",
    )
    export.add_argument(
        "--output", "-o", metavar="FILE",
        help="write the export here (default: stdout); the public key goes to stderr",
    )
    export.set_defaults(handler=run_export)

    fork = _session_command(
        commands,
        "fork",
        help="copy a session up to a turn boundary into a new session (the source is not "
        "changed); the child carries the effects ledger of the turns it leaves out",
    )
    point = fork.add_mutually_exclusive_group()
    point.add_argument("--at", type=int, metavar="SEQ",
                       help="keep events 0..SEQ (SEQ must be a turn boundary)")
    point.add_argument("--turn", type=int, metavar="N", help="keep turns 1..N")
    fork.add_argument("--id", dest="child_id", metavar="CHILD",
                      help="the new session's id (default: a fresh one)")
    fork.add_argument("--json", action="store_true", help="print one JSON object")
    fork.set_defaults(handler=run_fork)

    otel = _session_command(
        commands,
        "export-otel",
        help="send a stored session as an OpenTelemetry trace (OTLP/HTTP, configured by the "
        "standard OTEL_EXPORTER_OTLP_* variables); needs the otel extra",
    )
    otel.add_argument(
        "--stdout", action="store_true",
        help="print the spans as JSON lines instead of sending them",
    )  # fmt: skip
    otel.set_defaults(handler=run_export_otel)


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


def _file_size(load_or_listing: Any) -> int | None:
    location = getattr(load_or_listing, "location", None)
    if location is None or location.kind != "jsonl":
        return None
    try:
        return os.stat(location.path).st_size
    except OSError:
        return None


# -- list ------------------------------------------------------------------------------


def run_list(args: argparse.Namespace) -> int:
    # A listing runs and records nothing: it may take the parsed composition from the cache
    # (docs/decisions.md D44); every other command parses the text itself.
    located = load_composition(args, remembered=True)[1]
    rows = persistence_rows(located)
    prices = price_table(located)
    remembered = ListCache.load(fresh=args.fresh)
    entries = None if args.fresh else _listed_without_host(rows, remembered, prices)
    if entries is None:
        entries = _listed_by_host(rows, remembered, prices)
    remembered.save()
    if args.json:
        for entry in entries:
            print(json.dumps(entry))
        return 0
    if not entries:
        print("no stored sessions")  # plain text: no terminal library for one line
        return 0
    if not sys.stdout.isatty():
        _print_rows(entries)
        return 0
    out = console()
    for number, text in enumerate(_table_lines(entries, out.width)):
        out.print(text, style="bold" if number == 0 else None, markup=False, highlight=False,
                  no_wrap=True, overflow="ignore")  # fmt: skip
    for entry in entries:
        if entry["problem"]:
            console().print(
                f"unreadable {terminal_safe(entry['sessionId'], multiline=False)}: "
                f"{terminal_safe(entry['problem'], multiline=False)}",
                style="red",
                markup=False,
            )
    return 0


def _listed_without_host(
    rows: list[LocatedRow], remembered: ListCache, prices: PriceTable
) -> list[dict[str, Any]] | None:
    """The listing with no composition booted and no event loop (docs/decisions.md D39): the
    store's own synchronous header read (``Plugin.list_stored``), every summary from the list
    cache. None when that cannot answer alone -- the store offers no such read, a log changed
    since it was last summarized (it must be read: the host's path reads it), or the quick read
    failed (the host's path fails the same way, with the message a booted store gives)."""
    store_rows = [r for r in rows if SESSION_PERSISTENCE.name in services_of(r.row)[0]]
    if len(store_rows) != 1:
        return None
    plugin, config = prepared_plugin(store_rows[0])
    list_stored = getattr(plugin, "list_stored", None)  # a plugin need not extend Plugin
    if list_stored is None:
        return None
    unreadable: list[UnreadableListing] = []
    try:
        listings = list_stored(config, unreadable)
    except Exception:  # reported by the host's path, exactly as it always was
        return None
    if listings is None:
        return None
    entries = [_unreadable_entry(bad) for bad in unreadable]
    for listing in listings:
        summary = remembered_summary(listing, remembered, prices)
        if summary is None:
            return None
        entries.append({**_listing_entry(listing), **summary})
    return _newest_first(entries)


def _listed_by_host(
    rows: list[LocatedRow], remembered: ListCache, prices: PriceTable
) -> list[dict[str, Any]]:
    """The listing through the booted store: every log the list cache cannot answer for is
    read (one bad log becomes its row's ``problem``, not a failed listing)."""

    async def body(host: PluginHost) -> list[dict[str, Any]]:
        store = persistence(host)
        unreadable: list[UnreadableListing] = []  # one damaged header must not hide the rest
        listings = await store.list(unreadable=unreadable)
        rows_out: list[dict[str, Any]] = [_unreadable_entry(bad) for bad in unreadable]
        with progress("reading sessions", total=len(listings)) as advance:
            for listing in listings:
                entry = _listing_entry(listing)
                try:
                    entry.update(await listing_summary(store, listing, remembered, prices))
                except Exception as exc:  # one bad log must not hide the others
                    entry["problem"] = str(exc)
                rows_out.append(entry)
                advance()
        return _newest_first(rows_out)

    # asyncio: a listing needs no trio, and importing trio is most of a cold start.
    return run_with_host(rows, body, backend="asyncio")


def _listing_entry(listing: Any) -> dict[str, Any]:
    """A listed session's row before its summary: what the header and the file say."""
    return {
        "sessionId": listing.header.id,
        "createdAt": listing.header.created_at,
        "cwd": listing.header.cwd if isinstance(listing.header.cwd, str) else None,
        "events": None,
        "lastTurnEnd": None,
        "size": _file_size(listing),
        "problem": None,
        "title": None,
        "usage": None,
        **_lineage(listing.header),
    }


def _newest_first(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Newest first; rows whose header could not be read (no creation time) last."""
    entries.sort(key=lambda e: (e["createdAt"] is not None, e["createdAt"] or 0), reverse=True)
    return entries


#: The terminal listing's optional columns, from most to least useful, each with the width from
#: which it is shown: on 80 columns a row is id, when, last turn and title, on one line.
_OPTIONAL_COLUMNS: tuple[tuple[str, int], ...] = (
    ("events", 96),
    ("tokens", 112),
    ("size", 124),
    ("cwd", 150),
)


def _short_when(ms: int | None, now: float | None = None) -> str:
    """``19:37`` today, ``12-03 19:37`` this year, ``2025-12-03`` before: a listing is scanned,
    and the full timestamp is in ``--json`` and ``show``."""
    if ms is None:
        return "-"
    import datetime as dt

    stamp = dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC)
    today = dt.datetime.fromtimestamp(time.time() if now is None else now, tz=dt.UTC)
    if stamp.date() == today.date():
        return stamp.strftime("%H:%M")
    return stamp.strftime("%m-%d %H:%M" if stamp.year == today.year else "%Y-%m-%d")


def _fit(text: str, width: int) -> str:
    """``text`` in exactly ``width`` terminal cells: padded, or cut with an ellipsis."""
    from rich.cells import cell_len, set_cell_size

    if cell_len(text) <= width:
        return set_cell_size(text, width)
    return set_cell_size(text, max(width - 1, 0)) + "…"


def _table_lines(entries: list[dict[str, Any]], width: int) -> list[str]:
    """The terminal listing at ``width`` columns: one line a session, never wrapped.

    The id is shown whole (people copy it); the other columns come in order of use while they
    fit, and the title takes what is left, cut with an ellipsis. Everything from a log is
    escaped first (ids, cwds and titles are stored data, never markup or control sequences).
    """
    from rich.cells import cell_len

    rows: list[dict[str, str]] = []
    for entry in entries:
        rows.append({
            "id": terminal_safe(entry["sessionId"], multiline=False),
            "when": _short_when(entry["createdAt"]),
            "last turn": entry["lastTurnEnd"] or ("unreadable" if entry["problem"] else "-"),
            "events": "-" if entry["events"] is None else str(entry["events"]),
            "tokens": _tokens(entry),
            "size": human_size(entry["size"]),
            "cwd": terminal_safe(entry["cwd"] or "-", multiline=False),
            "title": terminal_safe(_titled(entry), multiline=False),
        })  # fmt: skip
    caps = {"last turn": 18, "tokens": 32, "cwd": 32}  # tokens: "12345 in, 678 out, $0.0123"

    def column_width(name: str) -> int:
        widest = max([cell_len(name), *(cell_len(row[name]) for row in rows)])
        return min(widest, caps.get(name, widest))

    gap, title_min = 2, 8
    columns = ["id", "when", "last turn"]
    used = sum(column_width(name) + gap for name in columns)
    for name, from_width in _OPTIONAL_COLUMNS:
        needed = column_width(name) + gap
        if width >= from_width and used + needed + title_min < width:
            columns.append(name)
            used += needed
    widths = {name: column_width(name) for name in columns}
    title = max(min(width - 1 - used, column_width("title")), title_min)
    right = {"events", "size"}

    def line(cells: dict[str, str]) -> str:
        parts = [
            cells[name].rjust(widths[name])
            if name in right and cell_len(cells[name]) <= widths[name]
            else _fit(cells[name], widths[name])
            for name in columns
        ]
        return (" " * gap).join([*parts, _fit(cells["title"], title)]).rstrip()

    header = line({name: name for name in [*columns, "title"]})
    return [header, *(line(row) for row in rows)]


def remembered_summary(
    listing: Any, remembered: ListCache, prices: PriceTable
) -> dict[str, Any] | None:
    """A listed session's summary (:func:`_summary`, without ``pricedWith``) from the list
    cache, if its log is unchanged since and was priced with these prices; else None."""
    key = listing_key(listing.location)
    summary = None if key is None else remembered.get(key, listing.revision)
    if summary is None or summary.get("pricedWith") != prices.fingerprint():  # other prices
        return None
    return {k: v for k, v in summary.items() if k != "pricedWith"}


async def listing_summary(
    store: Any, listing: Any, remembered: ListCache, prices: PriceTable
) -> dict[str, Any]:
    """A listed session's summary (:func:`_summary`): from the list cache while the log is
    unchanged and was priced with these prices, else read from the log and remembered. Raises
    what reading the log raised."""
    summary = remembered_summary(listing, remembered, prices)
    if summary is not None:
        return summary
    key = listing_key(listing.location)
    try:
        load = await store.inspect(listing.header.id)
    except Exception:
        if key is not None:
            remembered.forget(key)
        raise
    summary = _summary(load, prices, prices.fingerprint())
    if key is not None:
        remembered.put(key, load.revision, summary)
    return {k: v for k, v in summary.items() if k != "pricedWith"}


def _summary(load: SessionLoad, prices: PriceTable, priced_with: str) -> dict[str, Any]:
    """The listing's fields read from the events (:data:`list_cache.SUMMARY_KEYS`): the
    session's :class:`SessionSummary`, its last turn's end as a resume will have it."""
    from .._session.summary import SessionSummary  # here: a listing of an unchanged root has
    # every summary remembered, and loads no summary code (docs/decisions.md D44)

    summary = SessionSummary.of(load, prices)
    end = summary.ended
    return {
        "events": summary.events,
        "lastTurnEnd": None if end is None else str(end.kind),
        "title": summary.title,
        "usage": summary.usage.to_wire(),
        "pricedWith": priced_with,
    }


def _print_rows(entries: list[dict[str, Any]]) -> None:
    """Not a terminal: a header, then one tab-separated row per session, nothing wrapped."""
    print("id\tcreated\tcwd\tevents\tlast turn\tsize\ttokens\ttitle")
    for entry in entries:
        fields = (
            entry["sessionId"],
            "-" if entry["createdAt"] is None else when(entry["createdAt"]),
            entry["cwd"] or "-",
            "-" if entry["events"] is None else str(entry["events"]),
            entry["lastTurnEnd"] or ("unreadable" if entry["problem"] else "-"),
            human_size(entry["size"]),
            _tokens(entry),
            _titled(entry),
        )
        # Tabs and newlines inside a field would break the row: shown escaped.
        print("\t".join(terminal_safe(f, multiline=False).replace("\t", "\\t") for f in fields))
    for entry in entries:
        if entry["problem"]:
            print(f"unreadable {terminal_safe(entry['sessionId'], multiline=False)}: "
                  f"{terminal_safe(entry['problem'], multiline=False)}")


def _lineage(header: Any) -> dict[str, Any]:
    """A listed session's links: the session it was forked or delegated from (D24)."""
    parent = header.parent_session
    depth = header.delegation_depth
    return {
        "parentSession": parent if isinstance(parent, str) else None,
        "origin": header.origin if isinstance(header.origin, str) else None,
        "delegationDepth": depth if isinstance(depth, int) else 0,
    }


def _titled(entry: dict[str, Any]) -> str:
    """The title column: a sub-agent's child session says whose child it is."""
    title = entry["title"] or "-"
    if entry.get("origin") == "subagent" and entry.get("parentSession"):
        return f"[sub-agent of {entry['parentSession']}] {title}"
    return title


def _unreadable_entry(bad: UnreadableListing) -> dict[str, Any]:
    """The row of a session whose header could not be read: its id and what is wrong."""
    return {
        "sessionId": bad.session_id,
        "createdAt": None,
        "cwd": None,
        "events": None,
        "lastTurnEnd": None,
        "size": _file_size(bad),
        "problem": str(bad.error),
        "title": None,
        "usage": None,
        "parentSession": None,
        "origin": None,
        "delegationDepth": 0,
    }


def _tokens(entry: dict[str, Any]) -> str:
    """The tokens column: the session's logged usage summed (``-`` if unreadable)."""
    return "-" if entry["usage"] is None else usage_line(entry["usage"])


# -- show -------------------------------------------------------------------------------


async def _read(host: PluginHost, session_id: str) -> SessionLoad:
    handle = await persistence(host).open(session_id, "read")
    try:
        load: SessionLoad = await handle.read()
        return load
    finally:
        await handle.close()


if TYPE_CHECKING:  # a listing never loads the token meter (tests/cli/test_startup.py)
    from .._session.tokens import TokenMeter, WalkedLog


@dataclasses.dataclass
class _Shown:
    """What ``show`` learnt while it printed a log: the folds its closing lines need."""

    meter: TokenMeter
    log: WalkedLog
    turns: set[int] = dataclasses.field(default_factory=set)
    delegations: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    torn_tail: Any = None


def run_show(args: argparse.Namespace) -> int:
    from .._session.session import derive_event_message
    from .._session.surface import surface_nodes

    located = load_composition(args)[1]
    rows = persistence_rows(located)
    prices = price_table(located)

    out = console()
    if args.view == "events":
        # Page by page: a 100k-event log is printed holding one page, not the log.

        async def events(host: PluginHost) -> None:
            async for page in persistence(host).walk(args.session_id):
                for event in page:
                    if args.json:
                        print(json_line(event_to_builtins(event)))
                    else:
                        out.print(event_summary(event), markup=False)

        run_with_host(rows, events)
        return 0
    if args.view == "transcript" and args.json:
        return _show_transcript_document(args, rows, prices)
    tree = bool(getattr(args, "tree", False))
    children: dict[str, SessionLoad | str] = {}

    def emit(lines: Iterable[tuple[str, str]]) -> None:
        for style, text in lines:
            out.print(text, style=style or None, markup=False)

    def show(walk: Callable[[], Iterator[SessionEvent]],
             lookup: Callable[[int], SessionEvent | None]) -> _Shown:
        from .._session.tokens import TokenMeter, WalkedLog

        shown = _Shown(TokenMeter(prices), WalkedLog())

        def tapped() -> Iterator[SessionEvent]:
            for event in walk():
                shown.meter.feed(shown.log, (event,))
                if event.type == "turn/start":
                    shown.turns.add(event.data.turn)
                elif event.type == "subagent/catalog":
                    shown.delegations.extend(_delegations((event,)))
                yield event

        if args.view == "transcript":
            # Everything that happened, from the events: turns, approvals, attempts, retries,
            # times, usage, rendered as the live run prints them; every original event and a
            # mark where compaction changed the model's view.
            emit(iter_transcript_lines(tapped(), full=args.full, turn=args.turn))
            return shown
        # The compacted surface: checkpoints and pruned results in place of what they
        # replace. One walk finds the surface's nodes, a second prints them in surface order
        # (a node out of log order, a compaction's checkpoint, waits for the ones before it).
        position = {seq: i for i, seq in enumerate(surface_nodes(tapped(), lookup))}
        if args.turn is not None and args.turn not in shown.turns:
            return shown  # refused below, before anything is printed
        waiting: dict[int, Message | None] = {}
        next_index = 0
        for event in walk():
            index = position.get(event.seq)
            if index is None:
                continue
            waiting[index] = derive_event_message(event)
            while next_index in waiting:
                message = waiting.pop(next_index)
                next_index += 1
                if message is None:
                    continue
                if args.json:
                    print(json_line(to_builtins(message)))
                else:
                    emit(message_lines(message))
        return shown

    async def body(host: PluginHost) -> _Shown:
        store = persistence(host)
        session_id = args.session_id
        shown: _Shown
        if getattr(store, "walked_tail", None) is None:
            # A store that cannot say a walk ended at a complete record: read it whole.
            load = await _read(host, session_id)
            events = load.events

            def point(seq: int) -> SessionEvent | None:
                return events[seq] if 0 <= seq < len(events) else None

            shown = await anyio.to_thread.run_sync(show, lambda: iter(events), point)
            shown.torn_tail = load.torn_tail
        else:
            shown = await anyio.to_thread.run_sync(
                show,
                lambda: _walked_events(store, session_id),
                lambda seq: _stored_event(store, session_id, seq),
            )
            trailing, _ = await store.walked_tail(session_id)
            if trailing != 0:  # a torn tail (or an append under way): the full read says which
                shown.torn_tail = (await store.inspect(session_id)).torn_tail
        if tree:
            await _read_children(host, shown.delegations, children)
        return shown

    shown = run_with_host(rows, body)
    if args.turn is not None and args.turn not in shown.turns:
        raise CliUsageError(f"--turn {args.turn}: session {args.session_id} has no such turn")
    if not args.json:
        meter, log = shown.meter, shown.log
        for line in usage_lines(meter.usage(log), meter.pressure(log)):
            out.print(line, style="dim", markup=False)
        if args.view == "transcript":
            emit(_delegation_lines(shown.delegations, children, full=args.full, indent=""))
    if not args.json and shown.torn_tail is not None:
        out.print(
            f"(the log has a torn tail: {shown.torn_tail.recovered} event(s) recovered; "
            f"`{command_hint('dsh', 'sessions', 'verify', args.session_id)}` explains)",
            style="yellow",
            markup=False,
        )
    return 0


def _show_transcript_document(args: argparse.Namespace, rows: Any, prices: PriceTable) -> int:
    """``show --json``: one document of turns, calls, approvals, results, times and usage (the
    messages the model is sent are ``--view model``, the log itself ``--view events``). It is
    one JSON value, built from the log read whole."""
    from .._session.packed import packed_copy
    from .._session.session import Session
    from .transcript_json import transcript_document

    load = run_with_host(rows, lambda host: _read(host, args.session_id))
    if args.turn is not None and not any(
        e.type == "turn/start" and e.data.turn == args.turn for e in load.events
    ):
        raise CliUsageError(f"--turn {args.turn}: session {load.id} has no such turn")
    from .._session.tokens import TokenMeter

    # The load's packed pages, shared: not a list of every decoded event (D37).
    session = Session.restore(load.header, packed_copy(load.events), mark_seed_end=False)
    meter = TokenMeter(prices)
    document = transcript_document(
        load.id, load.events, usage=meter.usage(session), turn_usage=meter.turn_usage(session)
    )
    if args.turn is not None:
        document["turns"] = [t for t in document["turns"] if t["turn"] == args.turn]
    print(json_line(document))
    return 0


def _delegations(events: Any) -> list[dict[str, Any]]:
    """The ``subagent/catalog`` facts of a log: the child sessions it delegated to (D24)."""
    found = []
    for event in events:
        if event.type == "subagent/catalog":
            data = to_builtins(event.data)
            if isinstance(data, dict) and isinstance(data.get("childId"), str):
                found.append(data)
    return found


async def _read_children(
    host: PluginHost,
    delegations: list[dict[str, Any]],
    into: dict[str, SessionLoad | str],
    depth: int = 0,
) -> None:
    """Read every child session of ``delegations``, and theirs (``--tree``)."""
    if depth >= 16:  # a cycle cannot be written by the plugin; a bounded walk all the same
        return
    for fact in delegations:
        child_id = fact["childId"]
        if child_id in into:
            continue
        try:
            child = await _read(host, child_id)
        except Exception as exc:  # a child that is gone or damaged must not hide the parent
            into[child_id] = str(exc)
            continue
        into[child_id] = child
        await _read_children(host, _delegations(child.events), into, depth + 1)


def _delegation_lines(
    delegations: list[dict[str, Any]],
    children: dict[str, SessionLoad | str],
    *,
    full: bool,
    indent: str,
) -> list[tuple[str, str]]:
    """One line per delegation (the child id to show); with ``--tree`` the child's transcript
    under it, indented, and its own delegations below that."""
    lines: list[tuple[str, str]] = []
    for fact in delegations:
        child_id = fact["childId"]
        label = fact.get("label")
        named = f" ({terminal_safe(str(label), multiline=False)})" if label else ""
        lines.append((
            "cyan",
            f"{indent}↳ sub-agent{named}: child session {terminal_safe(child_id, multiline=False)}"
            + ("" if child_id in children else f"  (dsh sessions show {child_id})"),
        ))  # fmt: skip
        child = children.get(child_id)
        if isinstance(child, str):
            lines.append(("red", f"{indent}  unreadable: {terminal_safe(child, multiline=False)}"))
        elif child is not None:
            inner = indent + "  │ "
            for style, text in transcript_lines(child.events, full=full, turn=None):
                lines.append((style, inner + text))
            lines.extend(_delegation_lines(
                _delegations(child.events), children, full=full, indent=indent + "  "
            ))  # fmt: skip
    return lines


# -- export-otel --------------------------------------------------------------------------


def run_export_otel(args: argparse.Namespace) -> int:
    """Replay a stored session's events through the ``telemetry-otel`` span builder.

    The plugin (and OpenTelemetry) is imported here only: nothing else of the CLI pays for it,
    and without the ``otel`` extra the command says how to install it. The composition's
    ``telemetry-otel`` row, when there is one, gives the agent name, service name and whether
    content is captured, so a replayed trace looks like the live one. The session's sub-agent
    children (its ``subagent/catalog`` facts, and theirs) are exported with it, their turns
    under the delegating calls' spans in the same trace (D30); a child that cannot be read is
    named on stderr and left out.
    """
    located = load_composition(args)[1]
    try:
        from dsh_telemetry_otel import TelemetryConfig, export_session, otlp_exporter
    except ImportError:
        raise CliUsageError(
            "dsh sessions export-otel needs OpenTelemetry, which is not installed: "
            + install_hint("otel")
        ) from None
    config = TelemetryConfig()
    for entry in located:
        row = entry.row
        if not row.disabled and TELEMETRY.name in services_of(row)[0]:
            try:
                config = msgspec.convert(row.config or {}, TelemetryConfig)
            except (msgspec.ValidationError, ValueError) as error:
                raise CliUsageError(f"row {row.id or row.name!r}: config: {error}") from None
            break
    rows = persistence_rows(located)

    async def body(host: PluginHost) -> tuple[SessionLoad, dict[str, SessionLoad | str]]:
        load = await _read(host, args.session_id)
        children: dict[str, SessionLoad | str] = {}
        await _read_children(host, _delegations(load.events), children)
        return load, children

    load, children = run_with_host(rows, body)
    events = [event_to_builtins(event) for event in load.events]
    tree: list[tuple[str, list[dict[str, Any]]]] = []
    for child_id, child in children.items():
        if isinstance(child, str):
            print(f"child session {child_id} left out: {child}", file=sys.stderr)
        else:
            tree.append((child_id, [event_to_builtins(event) for event in child.events]))
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SpanExporter

    exporter: SpanExporter
    if args.stdout:
        exporter = ConsoleSpanExporter(
            out=sys.stdout, formatter=lambda span: span.to_json(indent=None) + "\n"
        )
    else:
        exporter = otlp_exporter()
    counts = export_session(
        load.id, events, exporter, config=config, prices=price_table(located), children=tree
    )
    summary = ", ".join(f"{count} {name}" for name, count in sorted(counts.items()))
    with_children = f" and {len(tree)} sub-agent session(s)" if tree else ""
    print(f"exported session {load.id}{with_children}: {summary or 'no spans'}", file=sys.stderr)
    return 0


# -- verify -----------------------------------------------------------------------------


def run_migrate(args: argparse.Namespace) -> int:
    """``dsh sessions migrate --to v4 ID``: the JSONL plugin's ``migrate_to_v4`` (docs/format.md
    §10.3: staged, verified, linked without overwriting; the v3 log stays byte-identical).
    A session already in v4, a torn or held one, or one DSH's own migration would rewrite
    is refused with the plugin's reason and nothing is written."""
    rows = persistence_rows(load_composition(args)[1])

    async def body(host: PluginHost) -> dict[str, Any]:
        service = persistence(host)
        migrate = getattr(service, "migrate_to_v4", None)
        if migrate is None:
            raise CliUsageError(
                f"the composition's session store ({type(service).__name__}) has no DSH "
                "format versions; only session-persistence-jsonl logs migrate to v4"
            )
        before = await _read(host, args.session_id)
        source = before.location.path if before.location is not None else None
        if before.source_version == 4:
            return {"sessionId": args.session_id, "to": 4, "path": source, "already": True}
        target = await migrate(args.session_id)
        return {"sessionId": args.session_id, "to": 4, "path": target, "kept": source}

    report = run_with_host(rows, body)
    if args.json:
        print(json_line(report))
    elif report.get("already"):
        console().print(
            f"{report['sessionId']} is already format v4 ({report['path']}); nothing written",
            markup=False,
        )
    else:
        out = console()
        out.print(f"migrated {report['sessionId']} to format v4: {report['path']}", markup=False)
        out.print(f"the v3 log is kept unchanged: {report['kept']}", style="dim", markup=False)
    return 0


#: Events per page when ``verify`` walks a log.
VERIFY_PAGE = 1024


@dataclasses.dataclass(frozen=True, slots=True)
class _Checks:
    events: int
    last_seq: int | None
    closers: list[str]
    problems: list[str]
    path: str | None


def _walked_events(store: Any, session_id: str) -> Iterator[SessionEvent]:
    """The stored log from seq 0, read page by page (``read_from`` with a limit) on a worker
    thread, which asks the event loop for each page: a reader holds a page, not the log (D33)."""
    import anyio.from_thread  # here: a listing needs none of it

    seq = 0
    while True:
        page = anyio.from_thread.run(
            functools.partial(store.read_from, session_id, seq, limit=VERIFY_PAGE)
        )
        yield from page
        if len(page) < VERIFY_PAGE:
            return
        seq = page[-1].seq + 1


def _stored_event(store: Any, session_id: str, seq: int) -> SessionEvent | None:
    """The stored event ``seq`` (None: not stored), read alone from a worker thread."""
    import anyio.from_thread

    found = anyio.from_thread.run(functools.partial(store.read_from, session_id, seq, limit=1))
    return found[0] if found else None


async def _walk_checks(store: Any, session_id: str) -> _Checks | None:
    """``verify``'s checks on a log read page by page (``read_from`` with a limit), so a
    100k-event log costs a page of memory, not the log: the call-pairing check and the
    closers a resume would append are each one pass over the pages (on a worker thread, which
    asks the event loop for each page). None when the store cannot say that the log it walked
    ends at a complete record
    (:meth:`~dsh_host._persistence.backend.PersistenceService.walked_tail`): the caller then
    reads it whole, where the torn-tail rules decide."""
    from .._session.repair import call_identity_problems, interrupted_turn_closers

    walked_tail = getattr(store, "walked_tail", None)
    if walked_tail is None:
        return None

    def pages() -> Iterator[SessionEvent]:
        return _walked_events(store, session_id)

    def check() -> tuple[int, int | None, list[str], list[str]]:
        count, last = 0, None

        def counted() -> Iterator[SessionEvent]:
            nonlocal count, last
            for event in pages():
                count, last = count + 1, event.seq
                yield event

        problems = call_identity_problems(counted())
        closers = [event.type for event in interrupted_turn_closers(pages())]
        return count, last, closers, problems

    count, last, closers, problems = await anyio.to_thread.run_sync(check)
    trailing, location = await walked_tail(session_id)
    if trailing != 0:
        return None
    return _Checks(count, last, closers, problems, location.path if location else None)


def run_verify(args: argparse.Namespace) -> int:
    from .._session.repair import call_identity_problems

    rows = persistence_rows(load_composition(args)[1])

    async def body(host: PluginHost) -> dict[str, Any]:
        report: dict[str, Any] = {
            "sessionId": args.session_id,
            "events": None,
            "lastSeq": None,
            "tornTail": None,
            "closers": [],
            "corrupt": None,
            "heldBy": None,
            "callProblems": [],
        }
        store = persistence(host)
        try:
            walked = await _walk_checks(store, args.session_id)
            if walked is None:
                # A log that does not end at a complete record (a torn tail, or an append in
                # progress), or a store that cannot tell: the full read classifies it.
                load = await store.inspect(args.session_id)
                walked = _Checks(
                    len(load.events), load.last_seq, [e.type for e in load.closers],
                    call_identity_problems(load.events),
                    load.location.path if load.location is not None else None,
                )
                if load.torn_tail is not None:
                    report["tornTail"] = {
                        "truncateTo": load.torn_tail.truncate_to,
                        "recovered": load.torn_tail.recovered,
                    }
        except SessionPersistenceCorruptionError as exc:
            where = exc.path or "?"
            at = f" at byte {exc.offset}" if exc.offset is not None else ""
            report["corrupt"] = f"{where}{at}: {exc}"
            return report
        report["events"] = walked.events
        report["lastSeq"] = walked.last_seq
        report["closers"] = walked.closers
        report["callProblems"] = walked.problems
        report["path"] = walked.path
        held_by = getattr(persistence(host), "held_by", None)  # a backend that can tell
        report["heldBy"] = await held_by(args.session_id) if held_by is not None else None
        return report

    with progress("verifying", total=None):
        report = run_with_host(rows, body)
    if report["corrupt"] is not None:
        code = 2
    elif report["heldBy"] is not None:
        code = 3
    elif report["callProblems"]:
        code = 2  # readable, but no repair can pair its calls again
    elif report["tornTail"] is not None or report["closers"]:
        code = 1
    else:
        code = 0
    if args.json:
        report.pop("path", None)
        print(json.dumps(report))
        return code
    out = console()
    if code == 2 and report["corrupt"] is None:
        problems = report["callProblems"]
        more = f" (and {len(problems) - 1} more; --json lists them)" if len(problems) > 1 else ""
        print(f"dsh: {args.session_id}: UNBALANCED CALLS: {problems[0]}{more}", file=sys.stderr)
        print("  the log was not modified; its calls cannot be paired with their results, so "
              "a model request from it would be refused or misread: continue from a fork made "
              "before the first of these events", file=sys.stderr)
        return code
    if code == 2:
        print(f"dsh: {args.session_id}: CORRUPT: {report['corrupt']}", file=sys.stderr)
        print("  the log was not modified; restore it from a backup or fork from an earlier "
              "session", file=sys.stderr)
        return code
    out.print(f"{args.session_id}: {report['events']} events, last seq {report['lastSeq']}"
              f" ({report['path']})", markup=False)
    if report["heldBy"] is not None:
        # A live writer's turn is running, not interrupted: its open calls are not lost.
        out.print(
            f"live: {report['heldBy']}; the log is being written, so an open turn is running, "
            "not interrupted — nothing to repair while it is held",
            style="yellow",
            markup=False,
        )
        return 3
    if code == 0:
        out.print("intact and balanced", style="green")
        return 0
    if report["tornTail"] is not None:
        torn = report["tornTail"]
        out.print(
            f"recoverable: torn tail after a crash; {torn['recovered']} complete event(s) "
            f"recovered from it, the torn bytes start at {torn['truncateTo']} (a resume "
            "rewrites them)",
            style="yellow",
            markup=False,
        )
    if report["closers"]:
        out.print(
            "recoverable: the last turn was interrupted; a resume appends "
            + ", ".join(report["closers"]),
            style="yellow",
            markup=False,
        )
    out.print(f"run `{command_hint('dsh', 'resume', args.session_id)}` to repair it", markup=False)
    return code


# -- export -----------------------------------------------------------------------------


def run_export(args: argparse.Namespace) -> int:
    """``dsh sessions export ID --attest``: the log as read, chained and signed.

    Reads like ``show`` (no lock taken, nothing written to the store); the file is written
    whole to a temporary name and renamed, so a reader never sees half an export.
    """
    from pathlib import Path

    from .._session.audit import attest_lines, load_or_create_key, public_key_text

    rows = persistence_rows(load_composition(args)[1])
    key = load_or_create_key(Path(args.key).expanduser() if args.key else None)
    session_id = args.session_id

    def write(out: Any, header: Any, events: Iterable[SessionEvent]) -> int:
        """The attested lines to ``out``; how many events they hold."""
        count = 0

        def counted() -> Iterator[dict[str, Any]]:
            nonlocal count
            for event in events:
                count += 1
                yield event_to_builtins(event)

        for line in attest_lines(session_id, to_builtins(header), counted(), key):
            out.write(line)
        return count

    async def body(host: PluginHost, out: Any) -> int:
        store = persistence(host)
        if getattr(store, "walked_tail", None) is not None:
            # Page by page (D33): the header from the listing, the events walked.
            header = await store.stored_header(session_id)
            count = await anyio.to_thread.run_sync(
                write, out, header, _walked_events(store, session_id)
            )
            trailing, _ = await store.walked_tail(session_id)
            if trailing == 0:
                return count
            # A torn tail (or an append under way): the full read decides what is exported.
            out.seek(0)
            out.truncate()
        load = await _read(host, session_id)
        return write(out, load.header, load.events)

    if args.output is None:
        # stdout cannot be rewound: a walk that meets a torn tail goes to a spool first.
        import tempfile

        with tempfile.TemporaryFile() as spool:
            count = run_with_host(rows, lambda host: body(host, spool))
            spool.seek(0)
            shutil.copyfileobj(spool, sys.stdout.buffer)
        sys.stdout.flush()
    else:
        target = Path(args.output)
        partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
        try:
            with open(partial, "w+b") as out:
                count = run_with_host(rows, lambda host: body(host, out))
                out.flush()
                os.fsync(out.fileno())
            os.replace(partial, target)
        except OSError as exc:
            partial.unlink(missing_ok=True)
            raise CliUsageError(
                f"--output {args.output}: cannot write it ({exc.strerror})"
            ) from None
        except BaseException:
            partial.unlink(missing_ok=True)
            raise
    print(
        f"dsh: exported {count} events of {session_id}, signed by Ed25519 key "
        f"{public_key_text(key)}",
        file=sys.stderr,
    )
    return 0


# -- fork -------------------------------------------------------------------------------


def run_fork(args: argparse.Namespace) -> int:
    """``dsh sessions fork ID [--at SEQ | --turn N]``: a new stored session (D27)."""
    from .._persistence.fork import ForkResult, fork_stored

    rows = persistence_rows(load_composition(args)[1])

    async def body(host: PluginHost) -> ForkResult:
        return await fork_stored(
            persistence(host), args.session_id, at=args.at, turn=args.turn,
            child_id=args.child_id,
        )  # fmt: skip

    result = run_with_host(rows, body)
    if args.json:
        print(json_line(result.to_json()))
        return 0
    out = console()
    out.print(
        f"forked {result.parent_session} at seq {result.boundary} -> {result.session_id}",
        markup=False,
    )
    effects = [e for e in result.effects if e["status"] != "not-started"]
    if effects:
        out.print(f"effects ledger ({len(effects)} call(s) of the abandoned branch):",
                  markup=False)  # fmt: skip
        for effect in effects:
            out.print(
                terminal_safe(f"  {effect['tool']} {effect['arguments']}: {effect['status']} "
                              f"({effect['idempotencyKey']})"),
                markup=False,
            )  # fmt: skip
    out.print(f"continue it with: {command_hint('dsh', 'resume', result.session_id)}",
              style="dim", markup=False)  # fmt: skip
    return 0
