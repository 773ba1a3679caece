"""Benchmark: what one streamed chunk costs, end to end through the OpenAI-compatible adapter.

A model's answer reaches dsh as Server-Sent Events, one small delta each; the harness decodes
the SSE framing, translates each payload into a stream chunk, relays it through the
``llm/stream`` chain into the agent loop, whose assembler builds the message and keeps the
timed stream the ``assistant/message`` event records (packed). Issue 36's target: at most
10 µs and bounded memory per chunk, measured as **the same 1 MB answer in 65,536 deltas
against the same answer in 20** (everything but the per-chunk work is the same in both).

A loopback HTTP server in its own process (so its CPU is not the bench's) answers every
``POST /chat/completions`` with a prepared SSE body: the answer cut into the number of deltas
the request's ``model`` names, then a finish chunk with usage and ``[DONE]``. The bench
process boots ``sessions``, ``llm``, ``tools``, ``agent`` and ``llm-openai-compatible``
pointed at that server (no persistence: the figure is the stream, not the disk), and runs one
turn per sample on a fresh agent: one request, one streamed text answer. The contenders
alternate (``--repeats``, default 7, ABAB...); per contender the median wall and process CPU
of a turn. Per chunk: (many − few) / (chunks of many − chunks of few), in µs, for wall and
CPU. Memory: one more turn of each under ``tracemalloc`` (apart from the timed ones: it slows
every allocation), its peak traced memory; per chunk the difference of the peaks over the
difference of the chunk counts, in bytes (the answer itself, 1 MB, is in both). Writes
``bench/results/streaming.json``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import tracemalloc
from typing import Any

import anyio
from _common import (
    cpu_ns,
    machine_info,
    median,
    now_ns,
    parser,
    print_table,
    ratio,
    scratch_dir,
    verdict,
    write_result,
)

from dsh_host import Row, open_host
from dsh_host._session.events import CompletedReason

ANSWER_BYTES = 1 << 20
MANY, FEW = 65_536, 20
SMALL_ANSWER_BYTES = 1 << 16
SMALL_MANY = 4096
PER_CHUNK_TARGET_US = 10.0

#: The loopback server, run as ``python -c SERVER ANSWER_BYTES``: prints its port, then serves
#: until its stdin closes. ``model`` ``chunks-N`` answers in N deltas.
SERVER = textwrap.dedent(
    """
    import http.server, json, sys, threading

    size = int(sys.argv[1])
    answer = ("lorem ipsum dolor sit amet " * (size // 27 + 1))[:size]
    bodies = {}

    def body(n):
        if n not in bodies:
            step = -(-len(answer) // n)
            out = []
            for i in range(0, len(answer), step):
                delta = {"choices": [{"index": 0, "delta": {"content": answer[i:i + step]}}]}
                out.append("data: " + json.dumps(delta) + "\\n\\n")
            finish = {
                "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 12, "completion_tokens": size // 4},
            }
            out.append("data: " + json.dumps(finish) + "\\n\\ndata: [DONE]\\n\\n")
            bodies[n] = "".join(out).encode()
        return bodies[n]

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self):
            request = json.loads(self.rfile.read(int(self.headers["content-length"])))
            data = body(int(request["model"].split("-")[1]))
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print(server.server_address[1], flush=True)
    sys.stdin.read()
    """
)


def rows(port: int) -> list[Row]:
    return [
        Row(name="sessions"),
        Row(name="llm"),
        Row(name="tools"),
        Row(
            name="llm-openai-compatible",
            config={
                "base_url": f"http://127.0.0.1:{port}/v1",
                "api_key_env": None,
                "provider": "loopback",
                "model": f"chunks-{FEW}",
                "context_window": 10_000_000,
            },
        ),
        Row(name="agent", config={"provider": "loopback", "model": f"chunks-{FEW}"}),
    ]


async def one_turn(host: Any, chunks: int, size: int) -> tuple[int, int]:
    """(wall ns, CPU ns) of one turn answered in ``chunks`` deltas; checks the answer."""
    agent = host.ctx.agent.create(model=f"chunks-{chunks}")
    wall, cpu = now_ns(), cpu_ns()
    reason = await agent.run_turn("Answer at length.")
    wall, cpu = now_ns() - wall, cpu_ns() - cpu
    if reason != CompletedReason():
        raise RuntimeError(f"the benchmark turn did not complete: {reason!r}")
    [message] = [e for e in agent.session.events if e.type == "assistant/message"]
    text = "".join(block.text for block in message.data.message.content)
    if len(text) != size:
        raise RuntimeError(f"the answer has {len(text)} characters, expected {size}")
    await agent.aclose()
    return wall, cpu


async def main_async(port: int, size: int, many: int, repeats: int) -> dict[str, Any]:
    samples: dict[int, list[tuple[int, int]]] = {many: [], FEW: []}
    peaks: dict[int, int] = {}
    async with open_host(rows(port)) as host:
        await one_turn(host, FEW, size)  # warm: connection, imports, first-call caches
        await one_turn(host, many, size)
        for _ in range(repeats):
            for chunks in (many, FEW):
                samples[chunks].append(await one_turn(host, chunks, size))
        for chunks in (many, FEW):
            tracemalloc.start()
            try:
                await one_turn(host, chunks, size)
                peaks[chunks] = tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()
    out: dict[str, Any] = {"answer_bytes": size, "repeats": repeats, "contenders": {}}
    for chunks in (many, FEW):
        walls = [w for w, _c in samples[chunks]]
        cpus = [c for _w, c in samples[chunks]]
        out["contenders"][str(chunks)] = {
            "chunks": chunks,
            "wall_ms_median": round(median(walls) / 1e6, 3),
            "cpu_ms_median": round(median(cpus) / 1e6, 3),
            "wall_ms_rounds": [round(w / 1e6, 3) for w in walls],
            "peak_traced_mib": round(peaks[chunks] / 2**20, 2),
        }
    extra = many - FEW
    many_row, few_row = out["contenders"][str(many)], out["contenders"][str(FEW)]
    out["per_chunk"] = {
        "wall_us": round((many_row["wall_ms_median"] - few_row["wall_ms_median"]) * 1e3 / extra, 3),
        "cpu_us": round((many_row["cpu_ms_median"] - few_row["cpu_ms_median"]) * 1e3 / extra, 3),
        "peak_bytes": round((peaks[many] - peaks[FEW]) / extra, 1),
        "many_over_few_wall": ratio(many_row["wall_ms_median"], few_row["wall_ms_median"]),
    }
    return out


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=7, help="interleaved pairs (default 7)")
    args = p.parse_args()
    if args.repeats < 1:
        p.error(f"--repeats must be at least 1, got {args.repeats}")
    size = SMALL_ANSWER_BYTES if args.small else ANSWER_BYTES
    many = SMALL_MANY if args.small else MANY
    repeats = 2 if args.small else args.repeats
    with scratch_dir(args.scratch, "streaming"):  # nothing is written: the answer is in memory
        info = machine_info()
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER, str(size)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        result = anyio.run(main_async, port, size, many, repeats, backend=args.backend)
    finally:
        assert server.stdin is not None
        server.stdin.close()
        server.wait(timeout=30)
    info["load_average_1_5_15_end"] = [round(x, 2) for x in os.getloadavg()]
    per = result["per_chunk"]
    print_table(
        f"streaming: a {size:,}-byte answer through llm-openai-compatible (loopback SSE) and "
        f"the agent loop; medians of {repeats} interleaved turns each",
        ["deltas", "wall ms", "cpu ms", "peak traced MiB"],
        [
            [c["chunks"], c["wall_ms_median"], c["cpu_ms_median"], c["peak_traced_mib"]]
            for c in result["contenders"].values()
        ],
    )
    targets = {
        "per_chunk_us_at_most": PER_CHUNK_TARGET_US,
        "wall_verdict": verdict(per["wall_us"], PER_CHUNK_TARGET_US),
        "cpu_verdict": verdict(per["cpu_us"], PER_CHUNK_TARGET_US),
    }
    print(
        f"\nper chunk: wall {per['wall_us']} µs ({targets['wall_verdict']}, target <= "
        f"{PER_CHUNK_TARGET_US}), CPU {per['cpu_us']} µs ({targets['cpu_verdict']}), peak "
        f"memory {per['peak_bytes']} bytes; load average {info['load_average_1_5_15']} -> "
        f"{info['load_average_1_5_15_end']}"
    )
    write_result(
        "streaming",
        {
            "small": args.small,
            "backend": args.backend,
            **result,
            "targets": targets,
            "machine": info,
        },
        args.results_dir,
    )


if __name__ == "__main__":
    main()
