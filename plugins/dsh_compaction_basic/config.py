"""Configuration of ``compaction-basic`` and its routed-model policy resolution (DSH's keys)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TypeVar

import msgspec

from dsh_host.sdk import CompactionError

__all__ = [
    "BasicCompactionConfig",
    "CompactSpec",
    "ModelCompactionPolicy",
    "TargetPolicy",
    "TargetPressureConfigError",
    "resolve_spec",
    "resolve_target_policy",
]

_T = TypeVar("_T")

DEFAULT_THRESHOLD_RATIO = 0.8
DEFAULT_RETAIN_RATIO = 0.16


class TargetPressureConfigError(CompactionError):
    """The routed model has no usable capacity or budget (warned once per target)."""

    def __init__(self, target_key: str, message: str, *, no_window: bool = False) -> None:
        super().__init__(message)
        self.target_key = target_key
        #: the route declares no context window at all (normal for local models)
        self.no_window = no_window


class _Policy(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    #: compact at ``floor(context_window * threshold_ratio)``
    threshold_ratio: float | None = None
    #: recent surface kept verbatim, as a fraction of the window (exclusive with retain_tokens)
    retain_ratio: float | None = None
    #: recent surface kept verbatim, in tokens (exclusive with retain_ratio)
    retain_tokens: int | None = None
    #: summary route; set together with summarization_model ('' inherits the conversation's)
    summarization_provider: str | None = None
    summarization_model: str | None = None
    #: generation cap of the summary request
    max_tokens: int | None = None
    #: extra attempts when pressure stays above the threshold
    compaction_retries: int | None = None
    #: retries after a provider context-window overflow (0: no recovery)
    max_overflow_retries: int | None = None

    def _check(self, where: str) -> None:
        if self.retain_ratio is not None and self.retain_tokens is not None:
            raise ValueError(f"{where}: retain_ratio and retain_tokens are mutually exclusive")
        for name, ratio in (("threshold_ratio", self.threshold_ratio),
                            ("retain_ratio", self.retain_ratio)):
            if ratio is not None and not (0 < ratio <= 1):
                raise ValueError(f"{where}: {name} ({ratio}) must be in (0, 1]")
        for name, value, low in (
            ("retain_tokens", self.retain_tokens, 0),
            ("max_tokens", self.max_tokens, 1),
            ("compaction_retries", self.compaction_retries, 0),
            ("max_overflow_retries", self.max_overflow_retries, 0),
        ):
            if value is not None and value < low:
                raise ValueError(f"{where}: {name} ({value}) must be an integer >= {low}")
        if (self.summarization_provider is None) != (self.summarization_model is None) or (
            bool(self.summarization_provider) != bool(self.summarization_model)
        ):
            raise ValueError(
                f"{where}: set summarization_provider and summarization_model together"
            )


class ModelCompactionPolicy(_Policy, forbid_unknown_fields=True, kw_only=True):
    """A partial override for one exact provider/model route."""

    provider: str
    model: str


class BasicCompactionConfig(_Policy, forbid_unknown_fields=True, kw_only=True):
    """YAML ``config:`` of a ``compaction-basic`` row (DSH ``BasicCompactionConfig``)."""

    #: exact-target overrides (duplicates refused)
    model_policies: list[ModelCompactionPolicy] = msgspec.field(default_factory=list)
    #: register the step-boundary pressure and overflow-recovery listeners
    auto: bool = True

    def __post_init__(self) -> None:
        self._check("compaction-basic")
        seen: set[tuple[str, str]] = set()
        for index, policy in enumerate(self.model_policies):
            where = f"compaction-basic model_policies[{index}]"
            policy._check(where)
            key = (policy.provider, policy.model)
            if key in seen:
                raise ValueError(f"{where}: duplicate target {policy.provider}/{policy.model}")
            seen.add(key)
            merged = resolve_target_policy(self, policy.provider, policy.model)
            _check_ratios(merged, where)
        _check_ratios(resolve_target_policy(self, "", ""), "compaction-basic")


@dataclass(frozen=True, slots=True)
class TargetPolicy:
    """The merged policy of one routed target, before capacity scaling."""

    provider: str
    model: str
    threshold_ratio: float
    retain_ratio: float | None
    retain_tokens: int | None
    summarization_provider: str
    summarization_model: str
    max_tokens: int
    compaction_retries: int
    max_overflow_retries: int

    @property
    def key(self) -> str:
        return f"{self.provider}/{self.model}"


@dataclass(frozen=True, slots=True)
class CompactSpec:
    """One routed model's concrete budgets."""

    policy: TargetPolicy
    context_window: int
    threshold_tokens: int
    retain_tokens: int


def _first(*values: _T | None) -> _T:
    """The first value that is set (the last argument is the default and always set)."""
    for value in values:
        if value is not None:
            return value
    raise AssertionError("no default given")


def resolve_target_policy(
    config: BasicCompactionConfig, provider: str, model: str
) -> TargetPolicy:
    """The defaults with the exact ``provider``/``model`` override merged over them."""
    override = next(
        (p for p in config.model_policies if (p.provider, p.model) == (provider, model)), None
    )
    retain_ratio, retain_tokens = config.retain_ratio, config.retain_tokens
    if retain_ratio is None and retain_tokens is None:
        retain_ratio = DEFAULT_RETAIN_RATIO
    o = override if override is not None else _Policy()
    if o.retain_ratio is not None or o.retain_tokens is not None:
        retain_ratio, retain_tokens = o.retain_ratio, o.retain_tokens  # replaces the choice
    return TargetPolicy(
        provider=provider,
        model=model,
        threshold_ratio=_first(o.threshold_ratio, config.threshold_ratio, DEFAULT_THRESHOLD_RATIO),
        retain_ratio=retain_ratio,
        retain_tokens=retain_tokens,
        summarization_provider=_first(
            o.summarization_provider, config.summarization_provider, ""
        ),
        summarization_model=_first(o.summarization_model, config.summarization_model, ""),
        max_tokens=_first(o.max_tokens, config.max_tokens, 8192),
        compaction_retries=_first(o.compaction_retries, config.compaction_retries, 1),
        max_overflow_retries=_first(o.max_overflow_retries, config.max_overflow_retries, 1),
    )


def _check_ratios(policy: TargetPolicy, where: str) -> None:
    if policy.retain_ratio is not None and policy.retain_ratio >= policy.threshold_ratio:
        raise ValueError(
            f"{where}: retain_ratio ({policy.retain_ratio}) must be less than the resolved "
            f"threshold_ratio ({policy.threshold_ratio})"
        )


def resolve_spec(policy: TargetPolicy, context_window: int) -> CompactSpec:
    """Scale ``policy`` to concrete budgets for a model of ``context_window`` tokens."""
    if context_window <= 0:
        raise TargetPressureConfigError(
            policy.key, f"compaction-basic: contextWindow ({context_window}) must be positive"
        )
    threshold = math.floor(context_window * policy.threshold_ratio)
    if policy.retain_tokens is not None:
        retain = policy.retain_tokens
    else:
        retain = math.floor(context_window * (policy.retain_ratio or 0.0))
    if retain >= threshold:
        raise TargetPressureConfigError(
            policy.key,
            f"compaction-basic: {policy.key} retain_tokens ({retain}) must be less than "
            f"threshold tokens {threshold}",
        )
    return CompactSpec(policy, context_window, threshold, retain)
