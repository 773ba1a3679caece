"""A crash inside a payment, and a reconciler that finds out whether it happened.

``python examples/reconciled_payment.py``. A fake payment API runs on loopback: ``POST
/payments`` with an ``Idempotency-Key`` header pays at most once per key, ``GET /payments/KEY``
looks a payment up. A child process runs the agent; its ``pay`` tool sends the call's
idempotency key, the API takes the payment, and the process is SIGKILLed before the result is
recorded. Crash repair alone could only say ``TOOL_OUTCOME_UNKNOWN``. The tool declares a
reconciler, so on resume dsh asks the API by the same key (through the same pipeline as the
tool) and records what it found: the call is answered with the real payment, the model is told,
and nothing is paid twice (D26 in docs/decisions.md).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import anyio

from dsh_host import Agent, Done, NotDone, ReconcileVerdict, ToolContext, Unknown, tool

SCRIPTS = Path(__file__).with_name("scripts")
STORE = ".dsh/sessions"


# --------------------------------------------------------------------------- the fake API


class Payments(BaseHTTPRequestHandler):
    """``POST /payments`` (``Idempotency-Key`` required), ``GET /payments/KEY``."""

    taken: ClassVar[dict[str, dict[str, Any]]] = {}
    lock: ClassVar[threading.Lock] = threading.Lock()

    def do_POST(self) -> None:
        key = self.headers.get("Idempotency-Key")
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
        if not key:
            return self._send(400, {"error": "Idempotency-Key is required"})
        with self.lock:
            payment = self.taken.setdefault(key, {"id": f"pay_{len(self.taken) + 1}", **body})
        self._send(201, payment)

    def do_GET(self) -> None:
        payment = self.taken.get(self.path.removeprefix("/payments/"))
        if payment:
            self._send(200, payment)
        else:
            self._send(404, {"error": "no such payment"})

    def _send(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


# --------------------------------------------------------------------------- the tool


def api() -> str:
    return os.environ["PAYMENTS_URL"]


def find_payment(ctx: ToolContext, payee: str) -> ReconcileVerdict:
    """Did the crashed call pay? Ask the API by the call's idempotency key."""
    try:
        with urllib.request.urlopen(f"{api()}/payments/{ctx.idempotency_key}") as reply:
            payment = json.load(reply)
    except urllib.error.HTTPError as exc:
        return NotDone() if exc.code == 404 else Unknown(f"the API answered {exc.code}")
    except OSError as exc:
        return Unknown(f"the API cannot be reached: {exc}")
    return Done(f"paid {payment['cents']} cents to {payee} ({payment['id']})")


@tool(reconcile=find_payment)
def pay(ctx: ToolContext, payee: str, cents: int) -> str:
    """Pay a payee, in cents.

    Args:
        payee: who is paid.
        cents: the amount in cents.
    """
    request = urllib.request.Request(
        f"{api()}/payments", data=json.dumps({"payee": payee, "cents": cents}).encode(),
        headers={"Idempotency-Key": ctx.idempotency_key, "Content-Type": "application/json"},
    )  # fmt: skip
    with urllib.request.urlopen(request) as reply:
        payment = json.load(reply)
    if os.environ.get("CRASH_AFTER_PAYING"):  # the demonstration's crash: paid, not recorded
        Path("session.id").write_text(str(ctx.session_id))
        os.kill(os.getpid(), signal.SIGKILL)
    return f"paid {payment['cents']} cents to {payee} ({payment['id']})"


# --------------------------------------------------------------------------- the two processes


async def crashing_run() -> None:
    async with Agent(f"scripted:{SCRIPTS / 'reconciled_payment_crash.yml'}", tools=[pay],
                     store=STORE) as agent:  # fmt: skip
        await agent.run("Pay acme $42.")


async def resume(session_id: str) -> None:
    async with Agent(f"scripted:{SCRIPTS / 'reconciled_payment_resume.yml'}", tools=[pay],
                     store=STORE) as agent:  # fmt: skip
        await agent.resume(session_id)
        for found in agent.core.reconciled:
            print(f"reconciled {found.call_id} ({found.tool}): {found.verdict}")
        result = await agent.run("Did the payment go through?")
    print(result.output)


def main() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Payments)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    env = {**os.environ, "PAYMENTS_URL": url, "CRASH_AFTER_PAYING": "1"}
    child = subprocess.run([sys.executable, __file__, "crash"], env=env, check=False)
    print(f"the agent process died: signal {-child.returncode}")
    print(f"payments taken: {len(Payments.taken)}")
    os.environ["PAYMENTS_URL"] = url
    anyio.run(resume, Path("session.id").read_text(), backend="trio")
    print(f"payments taken: {len(Payments.taken)}")
    server.shutdown()


if __name__ == "__main__":
    if sys.argv[1:] == ["crash"]:
        anyio.run(crashing_run, backend="trio")
    else:
        main()
