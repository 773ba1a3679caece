"""``dsh serve``: sessions behind an HTTP API, event streams, approvals and a web inspector.

The top layer beside the CLI: it may import every layer below it and nothing imports it
but the CLI's ``serve`` command. The web stack (Starlette, Hypercorn, prometheus_client) is
the optional ``serve`` extra and is imported only when the server starts:
:mod:`.command` (the argument parser) imports none of it.

- :mod:`.runtime` — plugin hosts, turns in the background, wake-ups for streams
- :mod:`.app` — the Starlette application (API, errors, auth, OpenAPI)
- :mod:`.serve` — Hypercorn on trio or asyncio, the loopback rule
- :mod:`.views` — what the API reports about a stored log (pure folds)
- :mod:`.metrics` — the Prometheus metrics
"""
