"""Jinja2 set up once (autoescaped always), with the filters the templates use."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.responses import HTMLResponse

from stepline.protocol import describe_encoded
from stepline.wire import in_words
from stepline_server.ui import options

TEMPLATES = Path(__file__).parent / "templates"


def _readable(value: Any) -> Any:
    """``value`` with each value the app encrypted or stored (and each encrypted text) told in
    words (``encrypted (key k2)``) instead of its blob: the orchestrator cannot read them."""
    told = describe_encoded(value)
    if told is not None:
        return told
    if isinstance(value, dict):
        return {k: _readable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_readable(v) for v in value]
    return value


def _pretty(value: Any) -> str:
    """JSON, indented, as text (escaped by the template like any other text); an encoded
    value in words."""
    told = describe_encoded(value)
    if told is not None:
        return told
    return json.dumps(_readable(value), indent=2, ensure_ascii=False)


def _text(value: Any) -> Any:
    """An error's message or traceback; an encrypted one in words."""
    return describe_encoded(value) or value


def _compact(value: Any) -> str:
    told = describe_encoded(value)
    if told is not None:
        return told
    text = json.dumps(_readable(value), ensure_ascii=False, separators=(",", ":"))
    return text if len(text) <= 120 else text[:117] + "..."


def _when(value: datetime | str | None) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        value = datetime.fromisoformat(value.replace("Z", "+00:00"))
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def _took(start: str | None, end: str | None) -> str:
    if not start:
        return "-"
    a = datetime.fromisoformat(start.replace("Z", "+00:00"))
    b = datetime.fromisoformat(end.replace("Z", "+00:00")) if end else datetime.now(UTC)
    return in_words((b - a).total_seconds()) + ("" if end else "…")


def _elapsed(start: str | None) -> str:
    """How long since ``start``, in words."""
    return _took(start, None).removesuffix("…")


def _ms(value: float | None) -> str:
    """Milliseconds in words (``30 s``, ``1 min 30 s``); ``-`` for none."""
    return "-" if value is None else in_words(value / 1000)


def _tail(value: str) -> str:
    """The end of an id, which tells apart ids made in the same minute (their starts are a
    time stamp)."""
    return "…" + value[-12:]


env = Environment(
    loader=FileSystemLoader(TEMPLATES),
    autoescape=select_autoescape(default=True, default_for_string=True),
    trim_blocks=True,
    lstrip_blocks=True,
)
env.filters.update(
    pretty=_pretty,
    compact=_compact,
    text=_text,
    when=_when,
    took=_took,
    elapsed=_elapsed,
    ms=_ms,
    tail=_tail,
    options=options.readable,
)


def page(name: str, status: int = 200, **context: Any) -> HTMLResponse:
    """The template ``name`` rendered with ``context``."""
    return HTMLResponse(env.get_template(name).render(**context), status)
