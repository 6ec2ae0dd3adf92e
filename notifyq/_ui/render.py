"""Turning data into HTML: the Jinja2 environment (autoescaped) and its filters.

Times are shown relative ("3 min ago") with the absolute UTC time on hover (``<time>``'s title);
the page's script keeps the relative text current without asking the server.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from uuid import UUID

from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup, escape

HERE = Path(__file__).parent
TEMPLATES = HERE / "templates"
STATIC = HERE / "static"


Moment = datetime | str | None
"""A time, or its ISO text (as the JSON-ready answers of ``app.keys`` have it)."""


def _moment(value: Moment) -> datetime | None:
    return datetime.fromisoformat(value) if isinstance(value, str) else value


def ago(moment: Moment, now: datetime | None = None) -> str:
    """``3 min ago`` / ``in 5 s`` (coarser the further away)."""
    value = _moment(moment)
    if value is None:
        return "—"
    delta = ((now or datetime.now(UTC)) - value).total_seconds()
    text = _span(abs(delta))
    if text == "now":
        return "just now"
    return f"{text} ago" if delta >= 0 else f"in {text}"


def _span(seconds: float) -> str:
    if seconds < 1:
        return "now"
    for unit, size in (("d", 86_400), ("h", 3_600), ("min", 60)):
        if seconds >= size:
            return f"{int(seconds // size)} {unit}"
    return f"{int(seconds)} s"


def absolute(moment: Moment) -> str:
    value = _moment(moment)
    if value is None:
        return ""
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def when(moment: Moment) -> Markup:
    """A ``<time>`` element: relative text, absolute on hover, ISO in ``datetime``."""
    value = _moment(moment)
    if value is None:
        return Markup("<span class=muted>—</span>")
    return Markup('<time datetime="{}" title="{}">{}</time>').format(
        value.isoformat(), absolute(value), ago(value))


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    return _span(seconds)


def pretty(value: Any) -> str:
    """JSON, indented; escaped by the template like any text."""
    return json.dumps(value, indent=2, ensure_ascii=False, default=str, sort_keys=False)


def count(value: int | None) -> str:
    return "—" if value is None else f"{value:,}"


def status_badge(status: str) -> Markup:
    return Markup('<span class="badge s-{}">{}</span>').format(
        escape(status), escape(status.replace("_", " ")))


SHORT_ID = 8
"""Hex digits of a run's short id: the end of the id. Its start is the time (UUIDv7), the same
for every run of a burst (1,501 runs of one shared their first 8 digits); the end is random,
and runs one process made in the same millisecond count up in it."""


def short_id(run_id: UUID | str) -> str:
    """``…9c3e3db5``: how the lists show a run id (the Run id box and a run page's address take
    it back)."""
    return "\u2026" + str(run_id)[-SHORT_ID:]


def environment() -> Environment:
    env = Environment(loader=FileSystemLoader(TEMPLATES), autoescape=select_autoescape(
        ["html"], default_for_string=True), trim_blocks=True, lstrip_blocks=True)
    env.filters.update(ago=ago, absolute=absolute, when=when, duration=duration,
                       pretty=pretty, count=count, badge=status_badge,
                       short_id=short_id)
    return env
