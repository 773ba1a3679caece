"""What a model call cost in money: a price table with per-model overrides.

Prices come from two places, in this order:

1. the ``prices:`` map of the ``token-meter`` row (or ``Agent(..., prices=...)``): US dollars
   per million tokens, keyed by the model id the provider reported (``provider:model`` keys win
   over bare ``model`` keys, so two routes serving the same id can be priced apart);
2. pydantic's ``genai-prices`` catalogue, a maintained table of public list prices, imported on
   the first lookup only (it is a large module: nothing that never prices a call pays for it).

A model found in neither has **no** cost: :meth:`PriceTable.cost` returns None, never 0, and the
totals count such calls as unpriced, so a display can say the cost is unknown instead of
printing a reassuring zero for a call that was billed.

The buckets are dsh's disjoint ones (:class:`~dsh_host._session.messages.TokenUsage`): uncached
input, cache reads and cache writes are priced each at their own rate (a model without a cache
rate is charged its input rate for them), output at the output rate; reasoning tokens are a part
of output, already in ``output_tokens``, never charged twice.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Final

from msgspec import UNSET

from dsh_host._session.messages import TokenUsage

#: Up to this length a :meth:`PriceTable.fingerprint` is the prices' text itself (it is kept
#: beside every remembered summary); longer, a SHA-256 of it.
_FINGERPRINT_TEXT_MAX: Final = 160

__all__ = ["MILLION", "ModelPrice", "PriceTable", "parse_prices"]

MILLION: Final = Decimal(1_000_000)


@dataclass(frozen=True, slots=True)
class ModelPrice:
    """One model's rates in US dollars per million tokens."""

    input: Decimal  #: uncached input
    output: Decimal  #: generated tokens (reasoning included)
    cache_read: Decimal | None = None  #: None: charged as uncached input
    cache_write: Decimal | None = None  #: None: charged as uncached input

    def cost(self, usage: TokenUsage) -> Decimal:
        """The exact cost of one call's usage (a :class:`~decimal.Decimal` of dollars)."""
        read = usage.cache_read_tokens if usage.cache_read_tokens is not UNSET else 0
        write = usage.cache_write_tokens if usage.cache_write_tokens is not UNSET else 0
        read_rate = self.cache_read if self.cache_read is not None else self.input
        write_rate = self.cache_write if self.cache_write is not None else self.input
        micro = (
            usage.input_tokens * self.input
            + read * read_rate
            + write * write_rate
            + usage.output_tokens * self.output
        )
        return micro / MILLION


_KEYS: Final = {"input", "output", "cache_read", "cache_write"}


def _rate(where: str, key: str, value: object) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(
            f"{where}.{key}: expected a number of US dollars per million tokens, got {value!r}"
        )
    try:
        rate = Decimal(str(value))
    except ArithmeticError:
        raise ValueError(f"{where}.{key}: {value!r} is not a number") from None
    if not rate.is_finite() or rate < 0:
        raise ValueError(f"{where}.{key}: a price must be a finite number >= 0, got {value!r}")
    return rate


def parse_prices(raw: Mapping[str, Any] | None, where: str = "prices") -> dict[str, ModelPrice]:
    """Validate a ``prices:`` map (``{model: {input, output, cache_read?, cache_write?}}``).

    Raises ValueError naming the entry and key that is wrong.
    """
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise ValueError(f"{where}: expected a map of model id to rates, got {raw!r}")
    table: dict[str, ModelPrice] = {}
    for model, rates in raw.items():
        entry = f"{where}.{model}"
        if not isinstance(model, str) or not model:
            raise ValueError(f"{where}: model ids must be non-empty strings, got {model!r}")
        if isinstance(rates, ModelPrice):
            table[model] = rates
            continue
        if not isinstance(rates, Mapping):
            raise ValueError(f"{entry}: expected a map with input and output, got {rates!r}")
        unknown = sorted(set(rates) - _KEYS)
        if unknown:
            raise ValueError(
                f"{entry}: unknown key(s) {', '.join(map(str, unknown))}; "
                "allowed: input, output, cache_read, cache_write"
            )
        missing = [key for key in ("input", "output") if key not in rates]
        if missing:
            raise ValueError(f"{entry}: missing {' and '.join(missing)} (dollars per 1M tokens)")
        table[model] = ModelPrice(
            input=_rate(entry, "input", rates["input"]),
            output=_rate(entry, "output", rates["output"]),
            cache_read=(
                _rate(entry, "cache_read", rates["cache_read"]) if "cache_read" in rates else None
            ),
            cache_write=(
                _rate(entry, "cache_write", rates["cache_write"])
                if "cache_write" in rates
                else None
            ),
        )
    return table


class PriceTable:
    """Prices model calls: configured overrides first, then the ``genai-prices`` catalogue.

    ``catalogue=False`` prices from the overrides only (every other model is unpriced).
    """

    def __init__(
        self, overrides: Mapping[str, ModelPrice] | None = None, *, catalogue: bool = True
    ) -> None:
        self._overrides = dict(overrides or {})
        self._catalogue = catalogue

    @property
    def overrides(self) -> Mapping[str, ModelPrice]:
        return self._overrides

    def fingerprint(self) -> str:
        """Names these prices: the overrides, the catalogue switch and the catalogue's version.

        A cost remembered under another fingerprint (the listing cache) is computed again.
        """
        catalogue = "off"
        if self._catalogue:
            # The installed catalogue's file, by size and time: no import of it (a large
            # module) and no distribution metadata scan (slow) just to name it.
            spec = importlib.util.find_spec("genai_prices")
            catalogue = "missing"
            if spec is not None and spec.origin:
                data = os.path.join(os.path.dirname(spec.origin), "data.py")
                try:
                    st = os.stat(data)
                    catalogue = f"{st.st_size}:{st.st_mtime_ns}"
                except OSError:
                    catalogue = spec.origin
        overrides = sorted(
            (key, str(p.input), str(p.output), str(p.cache_read), str(p.cache_write))
            for key, p in self._overrides.items()
        )
        text = repr((catalogue, overrides))
        if len(text) <= _FINGERPRINT_TEXT_MAX:
            # The prices named by their own short text: no hash, so a listing of an unchanged
            # root does not load OpenSSL (docs/decisions.md D44).
            return text
        import hashlib  # here: only long override tables are hashed

        return "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:16]

    def cost(self, provider: str | None, model: str | None, usage: TokenUsage) -> Decimal | None:
        """Dollars one call cost, or None when the model has no known price."""
        if not model:
            return None
        override = None
        if provider:
            override = self._overrides.get(f"{provider}:{model}")
        if override is None:
            override = self._overrides.get(model)
        if override is not None:
            return override.cost(usage)
        if not self._catalogue:
            return None
        return _catalogue_cost(provider, model, usage)


#: (the catalogue snapshot, the (provider id, model) lookups it has no entry for): a lookup
#: that missed is not tried again while the catalogue in force is the same object (each try
#: scans its providers and raises ``LookupError``, at every priced reply).
_misses: tuple[object, set[tuple[str | None, str]]] = (None, set())


def _catalogue_cost(provider: str | None, model: str, usage: TokenUsage) -> Decimal | None:
    global _misses
    try:
        from genai_prices import Usage, calc_price
        from genai_prices.data_snapshot import get_snapshot
    except ImportError:  # the catalogue is a dependency; a broken install prices nothing
        return None
    snapshot = get_snapshot()
    if _misses[0] is not snapshot:
        _misses = (snapshot, set())
    missed = _misses[1]
    # dsh's provider is the route name (``openai-compatible``, a row id...), which names a
    # catalogue provider only sometimes: try it, then the model id alone. Lookups that missed
    # before are left out first: a route the catalogue does not know (a scripted or local
    # model, priced at every reply) builds nothing (docs/decisions.md D49).
    lookups = [
        provider_id
        for provider_id in ((provider, None) if provider else (None,))
        if (provider_id, model) not in missed
    ]
    if not lookups:
        return None
    read = usage.cache_read_tokens if usage.cache_read_tokens is not UNSET else 0
    write = usage.cache_write_tokens if usage.cache_write_tokens is not UNSET else 0
    # genai-prices counts cache reads and writes inside input_tokens; dsh's buckets are disjoint.
    priced = Usage(
        input_tokens=usage.input_tokens + read + write,
        cache_read_tokens=read,
        cache_write_tokens=write,
        output_tokens=usage.output_tokens,
    )
    for provider_id in lookups:
        try:
            return calc_price(priced, model_ref=model, provider_id=provider_id).total_price
        except LookupError:
            missed.add((provider_id, model))
            continue
        except Exception:  # a catalogue entry it cannot compute (a tier it lacks): unknown
            return None
    return None
