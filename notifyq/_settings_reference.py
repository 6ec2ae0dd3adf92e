"""The settings reference, docs/settings.md, generated from the fields of :class:`Settings`.

Every field of the model tree, sections and the items of list-of-object settings included, with
its environment variable, type, default and description (the attribute docstring below the
field, or ``Field(description=...)``). A description ends by stating the default ("Defaults to
…" or "Required."); that sentence becomes the reference's default. Regenerate with::

    python -m notifyq._settings_reference > docs/settings.md

``--check docs/settings.md`` exits 1 when the file is not this output (``.ci/run lint``, the
pre-commit hook); ``tests/docs/test_settings_reference.py`` fails then too.
"""

from __future__ import annotations

import ast
import functools
import inspect
import json
import re
import sys
import textwrap
import types
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo
from pydantic_settings import NoDecode

from notifyq import Settings

PREFIX = "NOTIFYQ_"
SHORTHANDS = {"api.admin_token": "NOTIFYQ_ADMIN_TOKEN", "api.read_token": "NOTIFYQ_READ_TOKEN"}
"""Variables that set a nested setting without its section (``Settings`` reads them before
validation; the long form wins when both are set)."""

_DEFAULT = re.compile(r"\s*(?:Defaults to (?P<text>.+?)|(?P<required>Required))\.\s*$",
                      re.DOTALL)


@dataclass(frozen=True)
class Entry:
    """One setting as the reference shows it."""

    path: str
    """Dotted, e.g. ``worker.lease_s``; an item field of a list is ``api.tokens[].name``."""
    env: str | None
    """Its environment variable; None for the fields of a list's items."""
    aliases: tuple[str, ...]
    env_form: str
    """How the environment writes it, when not a plain value: "a JSON list", …"""
    type: str
    default: str
    description: str
    literal: Any
    """The default value itself (None when the setting is required)."""
    stated: str | None
    """The default as the description states it ("1 day", "lease_s / 3"); None: required."""


@dataclass(frozen=True)
class Section:
    """A heading of the reference and the settings under it."""

    path: str
    title: str
    description: str
    env: str | None
    entries: tuple[Entry, ...]


# -- walking the model tree ----------------------------------------------------------------


def sections(model: type[BaseModel] = Settings) -> list[Section]:
    """The top-level settings, then each section and list of objects, depth first."""
    found: list[Section] = []
    _walk(model, (), found, in_list=False)
    return found


def entries() -> Iterator[Entry]:
    for section in sections():
        yield from section.entries


def _walk(model: type[BaseModel], path: tuple[str, ...], found: list[Section], *,
          in_list: bool) -> None:
    docs = _attribute_docstrings(model)
    leaves: list[Entry] = []
    nested: list[tuple[str, type[BaseModel], bool]] = []
    for name, field in model.model_fields.items():
        annotation = _unwrap(field.annotation)
        if _is_model(annotation):
            nested.append((name, annotation, False))
            continue
        item = _list_item(annotation)
        if item is not None and _is_model(item):
            nested.append((name, item, True))
        leaves.append(_entry(path, name, field, docs.get(name, ""), in_list=in_list))
    dotted = ".".join(path)
    title = "Top level" if not path else f"`{dotted}`"
    found.append(Section(dotted, title, _clean(_class_doc(model)) if path else "",
                         None if in_list or not path else _env(path), tuple(leaves)))
    for name, child, is_list in nested:
        step = f"{name}[]" if is_list else name
        _walk(child, (*path, step), found, in_list=in_list or is_list)


def _entry(path: tuple[str, ...], name: str, field: FieldInfo, docstring: str, *,
           in_list: bool) -> Entry:
    dotted = ".".join((*path, name))
    text = _clean(field.description or docstring)
    match = _DEFAULT.search(text)
    if match is None:
        raise ValueError(f"{dotted}: its description must end by stating the default "
                         f"('Defaults to ….' or 'Required.'), got {text!r}")
    description = text[:match.start()].strip()
    stated = None if match["required"] else match["text"].strip()
    required = field.is_required()
    if required != (stated is None):
        raise ValueError(f"{dotted}: the description says it "
                         f"{'is required' if stated is None else 'has a default'}; the field "
                         f"{'is required' if required else 'has a default'}")
    literal = None if required else field.get_default(call_default_factory=True)
    env = None if in_list else _env((*path, name))
    return Entry(dotted, env, (SHORTHANDS[dotted],) if dotted in SHORTHANDS else (),
                 "" if in_list else _env_form(field), _type(field.annotation, field.metadata),
                 "required" if stated is None else _default(literal, stated),
                 description, literal, stated)


def _env(path: tuple[str, ...]) -> str:
    return PREFIX + "__".join(part.removesuffix("[]").upper() for part in path)


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _unwrap(annotation: Any) -> Any:
    """``X`` of ``X | None`` and of ``Annotated[X, ...]``."""
    if get_origin(annotation) is Annotated:
        return _unwrap(get_args(annotation)[0])
    if get_origin(annotation) in (Union, types.UnionType):
        rest = [a for a in get_args(annotation) if a is not type(None)]
        if len(rest) == 1:
            return _unwrap(rest[0])
    return annotation


def _list_item(annotation: Any) -> Any:
    return _unwrap(get_args(annotation)[0]) if get_origin(annotation) is list else None


# -- docstrings ----------------------------------------------------------------------------


@functools.cache
def _attribute_docstrings(model: type[BaseModel]) -> dict[str, str]:
    """The string literal right below each ``name: type = ...`` of the class body (and of its
    bases), which is where notifyq documents a setting."""
    docs: dict[str, str] = {}
    for cls in reversed(model.__mro__):
        if not (isinstance(cls, type) and issubclass(cls, BaseModel)) or cls is BaseModel:
            continue
        try:
            source = textwrap.dedent(inspect.getsource(cls))
        except (OSError, TypeError):  # pragma: no cover - no source (a frozen build)
            continue
        body = ast.parse(source).body[0]
        assert isinstance(body, ast.ClassDef)  # noqa: S101 - getsource of a class
        for node, after in zip(body.body, body.body[1:], strict=False):
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                    and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                    and isinstance(after.value.value, str)):
                docs[node.target.id] = after.value.value
    return docs


def _class_doc(model: type[BaseModel]) -> str:
    doc = model.__dict__.get("__doc__")
    return doc if isinstance(doc, str) else ""


def _clean(text: str) -> str:
    """One paragraph of Markdown: reST's ``code`` becomes `code`."""
    return " ".join(text.split()).replace("``", "`")


# -- types and defaults --------------------------------------------------------------------


_NAMES = {bool: ("boolean", "booleans"), int: ("integer", "integers"),
          float: ("number", "numbers"), str: ("string", "strings"), Path: ("path", "paths"),
          SecretStr: ("secret string", "secret strings")}


def _type(annotation: Any, metadata: list[Any], *, plural: bool = False) -> str:
    """Words for a field's type and constraints: "integer from 1 to 10000", "list of strings"."""
    origin = get_origin(annotation)
    if origin is Annotated:
        inner, *extra = get_args(annotation)
        more = [m for e in extra for m in (e.metadata if isinstance(e, FieldInfo) else [e])]
        return _type(inner, [*metadata, *more], plural=plural)
    if origin in (Union, types.UnionType):
        rest = [a for a in get_args(annotation) if a is not type(None)]
        return " or ".join(_type(a, metadata if len(rest) == 1 else [], plural=plural)
                           for a in rest)
    if origin is Literal:
        return ("values from " if plural else "one of ") + ", ".join(
            f"`{value}`" for value in get_args(annotation))
    if origin is list:
        size = _bounds(metadata, "items")
        items = _type(get_args(annotation)[0], [], plural=True)
        return f"list of {items}" + (f", {size}" if size else "")
    if _is_model(annotation):
        return "objects (fields below)" if plural else "object (fields below)"
    singular, many = _NAMES.get(annotation, (str(annotation), str(annotation)))
    return " ".join(part for part in (many if plural else singular,
                                      _bounds(metadata, "characters")) if part)


def _bounds(metadata: list[Any], unit: str) -> str:
    """"from 1 to 10", "> 0", "≥ 0 and < 1", "of 1 to 64 characters", "matching `…`"."""
    b = {kind: getattr(m, kind) for m in metadata
         for kind in ("ge", "gt", "le", "lt", "min_length", "max_length", "pattern")
         if getattr(m, kind, None) is not None}
    words = []
    if "ge" in b and "le" in b:
        words.append(f"from {b['ge']} to {b['le']}")
    elif comparisons := [f"{sign} {b[kind]}" for kind, sign in
                         (("gt", ">"), ("ge", "≥"), ("lt", "<"), ("le", "≤")) if kind in b]:
        words.append(" and ".join(comparisons))
    low, high = b.get("min_length"), b.get("max_length")
    if high is not None:
        of = "" if unit == "items" else "of "
        words.append(f"{of}{low} to {high} {unit}" if low else f"{of}at most {high} {unit}")
    if "pattern" in b:
        words.append(f"matching `{b['pattern']}`")
    return ", ".join(words)


def _env_form(field: FieldInfo) -> str:
    annotation = _unwrap(field.annotation)
    if get_origin(annotation) is list:
        if any(m is NoDecode or isinstance(m, NoDecode) for m in field.metadata):
            return "comma-separated, or a JSON list"
        return "a JSON list"
    return ""


def _literal(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | Path):
        return str(value)
    return json.dumps(value, default=str)


def _normal(text: str) -> str:
    return text.strip("\"'` ").lower()


def _default(literal: Any, stated: str) -> str:
    """The literal default, then what the description adds to it ("1 day", "plus …")."""
    said = _clean(stated)
    if literal is None or (literal == [] and _normal(said).startswith("none")):
        return said
    shown = _literal(literal)
    quoted = re.match(r"[\"'`]?" + re.escape(shown) + r"[\"'`]?(?![\w.])", said,
                      re.IGNORECASE)
    if quoted:
        return f"`{shown}`{said[quoted.end():]}"
    if re.fullmatch(r"-?[\d.]+|true|false", said, re.IGNORECASE):
        raise ValueError(f"a description says the default is {said}; the field's is {shown}")
    return f"`{shown}` ({said})"


# -- the page ------------------------------------------------------------------------------


INTRO = """\
# Settings reference

<!-- Generated by `python -m notifyq._settings_reference` from the fields of notifyq.Settings:
edit the descriptions in the code, then regenerate this file with
`python -m notifyq._settings_reference > docs/settings.md` (a test fails while it differs). -->

Every setting notifyq reads, with its environment variable, type, default and meaning.

**Where settings come from**, highest first: arguments given in code (`App(dsn=...)`,
`App(settings=Settings(...))`), then `NOTIFYQ_*` environment variables, then the YAML file named
by `NOTIFYQ_CONFIG_FILE`, or `notifyq.yaml` in the current directory when it exists. A setting in
a section is `section.name` in the file and `NOTIFYQ_SECTION__NAME` in the environment (two
underscores). In the environment, lists and objects are JSON, except the lists that also take a
comma-separated form (said below); a whole section may also be one JSON object
(`NOTIFYQ_WORKER='{"concurrency": 20}'`). Command-line flags such as `--concurrency` or `--port` win
over all of these for their command.

**Validation happens at start**: an invalid value stops the process with one line naming the
setting and its variable, e.g.
`invalid configuration: worker.concurrency (NOTIFYQ_WORKER__CONCURRENCY): Input should be
greater than or equal to 1`; a config file that is not valid YAML is named with its line and
column. Unknown settings in the file are refused too; an unknown `NOTIFYQ_*` variable is
ignored, so check the names below. Secrets (`keys`, tokens, passwords in
`database_url`) never appear in logs or errors.

A `notifyq.yaml` with a few of them:

```yaml
schema_name: notifyq
worker:
  concurrency: 20
  pools: [default, emails, webhooks]   # replaces the default: keep webhooks to deliver them
purger:
  completed_retention_s: 3600
api:
  tokens:
    - {name: dashboard, token: a-long-random-read-only-token, scopes: [read]}
webhooks:
  allowed_networks: [10.20.0.0/16]
```
"""


def render() -> str:
    """docs/settings.md."""
    parts = [INTRO, "Sections: " + " · ".join(
        f"[{s.path or 'top level'}](#{_anchor(s.title)})" for s in sections()) + "\n"]
    for section in sections():
        parts.append(_section(section))
    return "\n".join(parts)


def _anchor(title: str) -> str:
    return re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")


def _section(section: Section) -> str:
    lines = [f"## {section.title}", ""]
    if section.description:
        lines += [section.description, ""]
    if section.path.endswith("[]"):
        lines += [f"Each item of `{section.path[:-2]}` is an object with these fields.", ""]
    for entry in section.entries:
        lines += _field(entry)
    return "\n".join(lines)


def _field(entry: Entry) -> list[str]:
    lines = [f"### `{entry.path}`", ""]
    if entry.description:
        lines += [entry.description, ""]
    if entry.env:
        names = " or ".join(f"`{name}`" for name in (entry.env, *entry.aliases))
        form = f" ({entry.env_form})" if entry.env_form else ""
        lines.append(f"- Environment: {names}{form}")
    lines += [f"- Type: {entry.type}", f"- Default: {entry.default}", ""]
    return lines


def main(argv: list[str]) -> int:
    """Print the reference; with ``--check PATH``, exit 1 unless PATH holds it already."""
    if not argv:
        print(render(), end="")
        return 0
    if len(argv) == 2 and argv[0] == "--check":
        path = Path(argv[1])
        if path.is_file() and path.read_text() == render():
            return 0
        print(f"{path} is out of date: regenerate it with "
              f"`python -m notifyq._settings_reference > {path}`", file=sys.stderr)
        return 1
    print("usage: python -m notifyq._settings_reference [--check PATH]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
