"""Schema pieces every group of routes shares: storable text, the problem body, and the
problem responses each route documents."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel

from notifyq._http.problems import MEDIA_TYPE


def _storable(value: str) -> str:
    """PostgreSQL text holds neither NUL nor unpaired surrogates: refuse them here (422)."""
    if "\x00" in value:
        raise ValueError("must not contain NUL characters")
    try:
        value.encode()
    except UnicodeEncodeError:
        raise ValueError("must be valid Unicode (no unpaired surrogates)") from None
    return value


Text = Annotated[str, AfterValidator(_storable)]


class Problem(BaseModel):
    """RFC 9457 problem details (``application/problem+json``)."""

    type: str = "about:blank"
    title: str
    status: int
    detail: str
    field: str | None = None
    errors: list[dict[str, str]] | None = None


def responses_for(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI responses of a route: ``codes`` plus what any request may get (an unparsable or
    too large body, a bad path or query value)."""
    return {code: {"model": Problem, "content": {MEDIA_TYPE: {}}}
            for code in sorted({*codes, 400, 413, 422})}
