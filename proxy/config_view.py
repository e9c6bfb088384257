"""The settings as they may be shown (`wsmode check-config`): plain data, every secret
replaced by a marker and every URL redacted (core/urls.py `redact_url`)."""

from __future__ import annotations

import dataclasses
from typing import Any

from .config import Settings
from .core.urls import REDACTED, redact_url


def redacted(settings: Settings) -> dict[str, dict[str, Any]]:
    """The settings as plain data, every secret replaced by a marker (never its value), and
    every credential in a URL too, alone or in a list (`redact_url`: userinfo, and query
    parameters such as password or token)."""
    out: dict[str, dict[str, Any]] = {}
    for section in dataclasses.fields(settings):
        obj = getattr(settings, section.name)
        table: dict[str, Any] = {}
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if f.metadata.get("secret") and value:
                value = [REDACTED] * len(value) if isinstance(value, tuple) else REDACTED
            elif isinstance(value, str) and "://" in value:
                value = redact_url(value)
            elif isinstance(value, tuple):  # a list of URLs (upstream.urls) is redacted too
                value = tuple(redact_url(v) if "://" in v else v for v in value)
            table[f.name] = list(value) if isinstance(value, tuple) else value
        out[section.name] = table
    return out
