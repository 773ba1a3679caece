"""The one place that decides under which terms a session runs (created or continued).

Every entry point -- ``dsh run`` / ``resume`` / ``approvals`` / ``chat``, ``dsh serve`` and its
queue workers, the Python ``Agent`` -- composes its rows, then asks this module:

* :func:`terms_of` for a new session: the terms the composed rows run under, recorded as the
  session's first ``run/terms`` event;
* :func:`plan_continuation` for a stored one: the rows patched back to the recorded terms, the
  explicit overrides of this command applied on top (and returned as the record to append, so the
  change is in the log before anything runs under it), or a :class:`TermsRefused` that says what
  differs and what to pass.

Why the terms are recorded instead of re-derived: a session continued by another command, another
process or another machine used to run under whatever that command defaulted to -- a built-in demo
script in place of the model, the composition's workspace-write in place of the ``read-only`` a
call was deferred under, another workspace. Now nothing but an explicit flag changes a term, and
the flag leaves a trace.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, replace

from msgspec import UNSET

from dsh_host._composition_edits import (
    config_of,
    enabled,
    merged,
    patch,
    patch_term,
    term_rows,
    term_value,
)
from dsh_host._compositions import composition_digest
from dsh_host._loader import LocatedRow, Row, canonical_name
from dsh_host._session.events.data import (
    ApprovalTerms,
    CompositionTerms,
    ModelRoute,
    RunTerms,
    SandboxTerms,
)
from dsh_host._shipped_plugins import declared_model_routes
from dsh_host.errors import ConfigError

from .models import ModelChoice, parse_model

__all__ = [
    "Overrides",
    "Plan",
    "TermsRefused",
    "composition_digest",
    "configured_route",
    "describe",
    "differences",
    "plan_continuation",
    "terms_of",
    "with_model",
]


class TermsRefused(ConfigError):
    """A stored session cannot continue here under its recorded terms (nothing was written)."""

    code = "TERMS_REFUSED"


@dataclass(frozen=True, slots=True)
class Overrides:
    """What this command sets explicitly (None: not given, the recorded value holds)."""

    model: ModelChoice | None = None
    model_spec: str | None = None
    workspace: str | None = None
    sandbox: str | None = None
    approval_policy: str | None = None
    unanswered: str | None = None
    #: the composition was named on this command (``--config``): it may differ from the recorded
    composition_named: bool = False


@dataclass(frozen=True, slots=True)
class Plan:
    """How a stored session continues: its rows, its terms, and the record to append first."""

    rows: list[LocatedRow]
    terms: RunTerms
    #: the ``run/terms`` event to append before anything runs (an override, or the terms a
    #: session that predates them is assumed to have), else None
    record: RunTerms | None
    #: what the command should say (a session without recorded terms: what is assumed)
    notes: tuple[str, ...] = ()


# -- reading terms off rows -------------------------------------------------------------------


def configured_route(located: Sequence[LocatedRow]) -> tuple[str, str] | None:
    """The (provider, model) the composition's agent row routes to, or None (it names none)."""
    agent = config_of(located, "agent")
    if agent is None:
        return None
    provider, model = agent.get("provider"), agent.get("model")
    if not isinstance(provider, str) or not provider:
        return None
    return provider, model if isinstance(model, str) else ""


def terms_of(
    located: Sequence[LocatedRow],
    *,
    composition: CompositionTerms,
    spec: str | None,
    by: str,
    reason: str = "created",
    changed: Sequence[str] = (),
) -> RunTerms:
    """The terms ``located`` (fully composed: model row, workspace, flags) runs under."""
    route = configured_route(located)
    model = None
    if route is not None:
        model = ModelRoute(provider=route[0], model=route[1], spec=spec if spec else UNSET)
    workspace = sandbox = None
    if term_rows(located, "workspace"):
        configured = term_value(located, "workspace", ".")
        if isinstance(configured, str) and configured:
            workspace = os.path.abspath(os.path.expanduser(configured))
    if term_rows(located, "sandbox"):
        sandbox = SandboxTerms(
            mode=str(term_value(located, "sandbox", "workspace-write")),
            network=str(term_value(located, "network", "deny")),
        )
    approval = None
    if term_rows(located, "approval_policy"):
        approval = ApprovalTerms(
            policy=str(term_value(located, "approval_policy", "ask")),
            unanswered=str(term_value(located, "unanswered", "fail")),
        )
    return RunTerms(
        reason=reason,  # type: ignore[arg-type]
        by=by,
        model=model,
        workspace=workspace,
        sandbox=sandbox,
        approval=approval,
        composition=composition,
        changed=tuple(changed) if changed else UNSET,
    )


def describe(terms: RunTerms) -> str:
    """One line for people: ``model P:M, workspace W, sandbox S (network N), approval ...``."""
    parts = []
    if terms.model is not None:
        parts.append(f"model {_route_name(terms.model)}")
    if terms.workspace is not None:
        parts.append(f"workspace {terms.workspace}")
    if terms.sandbox is not None:
        parts.append(f"sandbox {terms.sandbox.mode} (network {terms.sandbox.network})")
    if terms.approval is not None:
        parts.append(f"approval {terms.approval.policy} (unanswered: {terms.approval.unanswered})")
    parts.append(f"composition {terms.composition.name} ({terms.composition.digest[:12]})")
    return ", ".join(parts)


def _route_name(route: ModelRoute) -> str:
    return route.spec if isinstance(route.spec, str) else f"{route.provider}:{route.model}"


# -- the model rows ---------------------------------------------------------------------------


def _routed(choice: ModelChoice) -> bool:
    """A ``PREFIX:MODEL`` spec (a plugin's declared route), not ``demo`` or ``scripted:``."""
    return any(choice.row.name == plugin for plugin, _ in declared_model_routes().values())


def with_model(located: list[LocatedRow], choice: ModelChoice, origin: str) -> list[LocatedRow]:
    """``located`` with ``choice`` as its model: the spec's own row first (or, for a declared
    route ``PREFIX:M`` on a composition that configures that adapter, the composition's row
    with only its model name replaced: endpoint, key and provider as configured), and the agent
    row routed to it."""
    located = list(located)
    routed = _routed(choice)
    if routed and enabled(located, choice.row.name):
        patch(located, choice.row.name, {"model": choice.model})
        config = config_of(located, choice.row.name) or {}
        provider = config.get("provider", choice.provider)
        choice = ModelChoice(
            Row(name=choice.row.name, config=config),  # no id: nothing is added
            provider if isinstance(provider, str) else choice.provider,
            choice.model,
        )
    if choice.row.id is not None:  # a row of its own (else the composition's, patched)
        located = [r for r in located if r.row.id != choice.row.id]
        located.insert(0, LocatedRow(choice.row, origin))
    route = {"provider": choice.provider, "model": choice.model}
    # the spec's own row or a declared route sets the agent's route; a composition's row only
    # fills in what the agent row leaves unset
    keep = choice.row.id is None and not routed
    return [
        replace(entry, row=merged(entry.row, route, keep_existing=keep))
        if canonical_name(entry.row.name) == "agent"
        else entry
        for entry in located
    ]


def portable_spec(spec: str) -> str:
    """``spec`` as it can be rebuilt from any directory: a script's path made absolute."""
    kind, sep, value = spec.partition(":")
    if sep and kind == "scripted" and value:
        return f"scripted:{os.path.abspath(value)}"
    return spec


# -- continuing a stored session ----------------------------------------------------------------


def plan_continuation(
    located: Sequence[LocatedRow],
    *,
    session_id: str,
    recorded: RunTerms | None,
    composition: CompositionTerms,
    overrides: Overrides,
    by: str,
    runs_turn: bool = True,
    repair_only: bool = False,
    cwd: str | None = None,
) -> Plan:
    """The rows and terms ``session_id`` continues under (see the module docstring).

    ``located`` is the composition as loaded, without a model row of the command's and without
    the command's flags. ``runs_turn`` False needs no model: nothing is requested;
    ``repair_only`` (a repair: no tool, no decision) checks nothing at all. ``cwd`` is the
    session header's directory (the tools' directory when the terms name no workspace).
    Raises :class:`TermsRefused` (a user's error: one line, nothing written).
    """
    rows = list(located)
    if recorded is None:
        return _assumed(rows, session_id, composition, overrides, by, runs_turn)
    if repair_only:
        return Plan(rows, recorded, None)  # nothing runs: no term is used, none is checked
    changed: list[str] = []
    if recorded.composition.digest != composition.digest:
        if not overrides.composition_named:
            raise TermsRefused(
                f'session "{session_id}" runs under composition {recorded.composition.name} '
                f"(rows sha256 {recorded.composition.digest[:12]}), and the one loaded here is "
                f"{composition.name} ({composition.digest[:12]}); pass --config FILE to continue "
                "it under that one (the change is logged)"
            )
        changed.append("composition")
    rows, route_changed = _continue_model(rows, session_id, recorded, overrides, runs_turn)
    if route_changed:
        changed.append("model")
    # A session recorded without tools has no workspace term; tools a later composition adds
    # work in its header's directory, never in wherever this command was started.
    workspace = recorded.workspace if recorded.workspace is not None else cwd
    if overrides.workspace is not None and overrides.workspace != workspace:
        workspace = overrides.workspace
        changed.append("workspace")
    if workspace is not None:
        patch_term(rows, "workspace", workspace)
    if recorded.sandbox is not None or overrides.sandbox is not None:
        mode = recorded.sandbox.mode if recorded.sandbox is not None else None
        if overrides.sandbox is not None and overrides.sandbox != mode:
            mode = overrides.sandbox
            changed.append("sandbox")
        if mode is not None:
            patch_term(rows, "sandbox", mode)
        if recorded.sandbox is not None:
            patch_term(rows, "network", recorded.sandbox.network)
    approval = recorded.approval
    policy = approval.policy if approval is not None else None
    unanswered = approval.unanswered if approval is not None else None
    if overrides.approval_policy is not None and (
        overrides.approval_policy != policy or (overrides.unanswered or "fail") != unanswered
    ):
        policy, unanswered = overrides.approval_policy, overrides.unanswered or "fail"
        changed.append("approval")
    if policy is not None:
        patch_term(rows, "approval_policy", policy)
        patch_term(rows, "unanswered", unanswered or "fail")
    spec = (
        _spec(overrides, recorded)
        if "model" in changed
        else (
            recorded.model.spec
            if recorded.model is not None and isinstance(recorded.model.spec, str)
            else None
        )
    )
    if not changed:
        return Plan(rows, recorded, None)
    terms = terms_of(
        rows, composition=composition, spec=spec, by=by, reason="override", changed=changed
    )
    return Plan(rows, terms, terms)


def _spec(overrides: Overrides, recorded: RunTerms | None) -> str | None:
    if overrides.model_spec is not None and overrides.model is not None:
        if overrides.model.row.id is not None:  # a row of its own: the spec rebuilds it
            return portable_spec(overrides.model_spec)
        return None
    if recorded is not None and recorded.model is not None:
        spec = recorded.model.spec
        return spec if isinstance(spec, str) else None
    return None


def _continue_model(
    rows: list[LocatedRow],
    session_id: str,
    recorded: RunTerms,
    overrides: Overrides,
    runs_turn: bool,
) -> tuple[list[LocatedRow], bool]:
    """The rows with the session's model (recorded, or the command's ``--model``); whether the
    route changed."""
    route = recorded.model
    if overrides.model is not None:
        rows = with_model(rows, overrides.model, f"--model {overrides.model_spec}")
        now = configured_route(rows)
        spec = _spec(overrides, None)
        before = route.spec if route is not None and isinstance(route.spec, str) else None
        return rows, route is None or now != (route.provider, route.model) or spec != before
    if route is None:
        if runs_turn and configured_route(rows) is None:
            raise TermsRefused(
                f'session "{session_id}" records no model and the composition names none; '
                "pass --model SPEC"
            )
        return rows, False
    if configured_route(rows) == (route.provider, route.model):
        return rows, False  # the composition configures this very route
    spec = route.spec if isinstance(route.spec, str) else None
    if not runs_turn:
        return rows, False  # a repair requests nothing: the route need not be buildable
    if spec == "demo":
        raise TermsRefused(
            f'session "{session_id}" was run by the built-in demo script, which runs only for a '
            "new `dsh run` with no model configured; pass --model SPEC to continue it with a "
            "model (the change is logged)"
        )
    if spec is None:
        raise TermsRefused(
            f'session "{session_id}" uses {route.provider}:{route.model}; its route is not '
            "configured here; pass --model or --config"
        )
    try:
        choice = parse_model(spec, flag="the session's recorded model")
    except ConfigError as exc:
        raise TermsRefused(f'session "{session_id}": {exc}; pass --model or --config') from None
    return with_model(rows, choice, f"the session's recorded model {spec}"), False


def _assumed(
    rows: list[LocatedRow],
    session_id: str,
    composition: CompositionTerms,
    overrides: Overrides,
    by: str,
    runs_turn: bool,
) -> Plan:
    """A session that predates recorded terms: today's composition and flags, said aloud and
    recorded (so the next command continues under the same), except the demo script, which
    never continues a session."""
    if overrides.model is not None:
        rows = with_model(rows, overrides.model, f"--model {overrides.model_spec}")
    elif runs_turn and configured_route(rows) is None:
        raise TermsRefused(
            f'session "{session_id}" records no run terms (it predates them) and names no '
            "model; pass --model SPEC (the built-in demo script never continues a session)"
        )
    if overrides.workspace is not None:
        patch_term(rows, "workspace", overrides.workspace)
    if overrides.sandbox is not None:
        patch_term(rows, "sandbox", overrides.sandbox)
    if overrides.approval_policy is not None:
        patch_term(rows, "approval_policy", overrides.approval_policy)
        patch_term(rows, "unanswered", overrides.unanswered or "fail")
    terms = terms_of(
        rows, composition=composition, spec=_spec(overrides, None), by=by, reason="assumed"
    )
    note = (
        f'session "{session_id}" records no run terms (it predates them); assuming '
        f"{describe(terms)}, and recording them"
    )
    return Plan(rows, terms, terms if runs_turn else None, (note,))


def differences(recorded: RunTerms, current: RunTerms) -> list[str]:
    """The terms ``current`` (what a composed host runs) would change, for people:
    ``sandbox read-only (here: workspace-write)``; the composition is not compared."""
    out: list[str] = []

    def model(route: ModelRoute | None) -> str:
        return "(none)" if route is None else _route_name(route)

    def same_model(a: ModelRoute | None, b: ModelRoute | None) -> bool:
        if a is None or b is None:
            return a is b
        specs = (a.spec, b.spec)
        return (a.provider, a.model) == (b.provider, b.model) and (
            UNSET in specs or specs[0] == specs[1]
        )

    if not same_model(recorded.model, current.model):
        out.append(f"model {model(recorded.model)} (here: {model(current.model)})")
    if recorded.workspace != current.workspace:
        out.append(f"workspace {recorded.workspace} (here: {current.workspace})")
    if recorded.sandbox != current.sandbox:

        def sandbox(terms: SandboxTerms | None) -> str:
            return "none" if terms is None else f"{terms.mode}, network {terms.network}"

        out.append(f"sandbox {sandbox(recorded.sandbox)} (here: {sandbox(current.sandbox)})")
    if recorded.approval != current.approval:

        def approval(terms: ApprovalTerms | None) -> str:
            return "none" if terms is None else f"{terms.policy}, unanswered {terms.unanswered}"

        out.append(f"approval {approval(recorded.approval)} (here: {approval(current.approval)})")
    return out
