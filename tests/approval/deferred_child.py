"""The process the deferred-approval kill tests SIGKILL, instrumented from outside production code.

``python deferred_child.py SPEC`` with SPEC a JSON object: ``config``, ``root`` (JSONL, or
null), ``workspace``, ``script``, ``session``, ``call`` and ``mode``:

* ``kill-asked`` -- create the session and run a turn; the (only) answerer makes the log durable
  and SIGKILLs this process while the approval question is open;
* ``kill-decided`` -- resume, record ``allow`` (durable), SIGKILL before continuing;
* ``kill-recheck`` -- resume, record ``allow``, continue; a ``tools/pre-execute`` listener makes
  the log durable and SIGKILLs this process while the decision is re-checked (the fresh
  ``tool/call`` is on disk, the body has not started);
* ``decide`` -- resume, record ``allow``, continue (the test kills us inside the body);
* ``continue`` -- resume and continue;
* ``hold`` -- resume, print ``held`` and keep the session open until killed.

Prints ``kill <mode>`` before killing itself and ``turn <kind>`` at a clean end.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from typing import Any

import anyio
import msgspec

from dsh_host import open_host
from dsh_host._cli.run_cmd import compose
from dsh_host._session.terms import record_terms


def say(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


async def main(spec: dict[str, Any]) -> None:
    args = argparse.Namespace(
        config=spec["config"], root=spec["root"], model=f"scripted:{spec['script']}",
        workspace=spec["workspace"], approval="defer", sandbox=None,
    )
    located, _, terms = compose(args, workspace=args.workspace, demo_workspace=False)
    mode = spec["mode"]
    async with open_host(located) as host:
        ctx = host.ctx

        async def die(session: Any) -> None:
            await ctx.sessions.flush(session)
            say(f"kill {mode}")
            os.kill(os.getpid(), signal.SIGKILL)

        if mode == "kill-asked":
            async def answerer(req: Any, next_: Any) -> Any:
                await die(req.agent.session)

            ctx.on("approval/request", answerer)
            agent = ctx.agent.create(session_id=spec["session"], cwd=spec["workspace"])
            record_terms(agent.session, terms)  # as `dsh run` does: the CLI continues under them
            reason = await agent.run_turn("append to the ledger")
        else:
            agent = await ctx.agent.resume(spec["session"])
            if mode == "hold":
                say("held")
                await anyio.sleep_forever()
            if mode != "continue":
                await agent.decide(spec["call"], "allow", decided_by="deferred_child")
            if mode == "kill-decided":
                await die(agent.session)
            if mode == "kill-recheck":
                async def recheck(exec_: Any, next_: Any) -> Any:
                    if exec_.call_id == spec["call"]:
                        await die(exec_.agent.session)
                    return await next_()

                ctx.on("tools/pre-execute", recheck, prepend=True)
            reason = await agent.continue_turn()
        say(f"turn {msgspec.to_builtins(reason)['kind']}")
        await agent.aclose()


if __name__ == "__main__":
    anyio.run(main, json.loads(sys.argv[1]), backend="trio")
