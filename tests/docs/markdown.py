"""Fenced code blocks of a Markdown file, with the marks that say how to run them.

A mark is an HTML comment on the line(s) right before a fence (invisible on GitHub, visible
in the source)::

    <!-- example: name=myapp file=myapp.py -->
    ```python
    ...
    ```

    <!-- example: after=myapp
    emails = ["a@b.c", "d@e.f"]
    -->
    ```python
    ...
    ```

The first line holds options (shell-quoted ``key=value`` words or bare flags); the lines after
it, up to ``-->``, are *setup*: code in the block's language that runs right before it. A
comment ``<!-- examples: key=value ... -->`` anywhere holds options for the whole file.
``parse`` refuses what it cannot run: an unknown option, a fence without a language, an
``after=`` naming no block, a ``covered-by=`` whose first word is not a file of the repo.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

RUNNABLE = {"sh": "sh", "bash": "sh", "shell": "sh", "python": "python", "sql": "sql",
            "yaml": "yaml"}
"""Languages the harness runs (aliases -> runner)."""
NOT_CODE = {"text"}
"""Languages for what is not code: printed output, synopses."""

BLOCK_OPTIONS = {"name", "after", "file", "covered-by", "background"}
FILE_OPTIONS = {"serve"}

_FENCE = re.compile(r"^(`{3,}|~{3,})\s*([\w+-]*)\s*$")
_MARK = re.compile(r"^<!--\s*(examples?):(.*)$")


class MarkdownError(ValueError):
    """A Markdown file whose blocks cannot be run as marked; the message names the line."""


@dataclass
class Block:
    path: Path
    line: int
    """1-based line of the opening fence."""
    language: str
    code: str
    options: dict[str, str] = field(default_factory=dict)
    setup: str = ""

    @property
    def runner(self) -> str | None:
        """``sh``/``python``/``sql``/``yaml``, or None for output and for a block covered
        elsewhere."""
        if self.language in NOT_CODE or "covered-by" in self.options:
            return None
        return RUNNABLE[self.language]

    @property
    def where(self) -> str:
        return f"{self.path.name}:{self.line}"

    @property
    def after(self) -> list[str]:
        return [n for n in self.options.get("after", "").split(",") if n]


@dataclass
class Document:
    path: Path
    blocks: list[Block]
    options: dict[str, str]

    def named(self, name: str) -> Block:
        return next(b for b in self.blocks if b.options.get("name") == name)

    def source(self, block: Block) -> str:
        """The code to run for ``block``: the blocks it comes ``after`` (each with theirs,
        once), then its setup, then its own code."""
        seen: list[Block] = []

        def visit(b: Block) -> None:
            for name in b.after:
                visit(self.named(name))
            if b not in seen:
                seen.append(b)

        visit(block)
        return "\n".join(part for b in seen for part in (b.setup, b.code) if part)


def _options(text: str, allowed: set[str], where: str) -> dict[str, str]:
    options = {}
    for word in shlex.split(text):
        key, _, value = word.partition("=")
        if key not in allowed:
            raise MarkdownError(f"{where}: unknown option {key!r} (known: "
                                f"{', '.join(sorted(allowed))})")
        options[key] = value
    return options


def _comment(lines: list[str], start: int) -> tuple[int, str, str]:
    """The comment starting at ``start`` -> (index of its last line, first line, the rest)."""
    first = lines[start]
    if first.rstrip().endswith("-->"):
        return start, first.rstrip()[:-3], ""
    end = start + 1
    while end < len(lines) and lines[end].strip() != "-->":
        end += 1
    if end == len(lines):
        raise MarkdownError(f"line {start + 1}: example comment not closed with a '-->' line")
    return end, first, "\n".join(lines[start + 1:end])


def parse(path: Path, root: Path) -> Document:
    """Every fenced block of ``path``; ``root`` is where ``covered-by`` paths must exist."""
    lines = path.read_text().splitlines()
    blocks: list[Block] = []
    file_options: dict[str, str] = {}
    pending: tuple[dict[str, str], str] | None = None  # the mark of the line right above
    i = 0
    while i < len(lines):
        where = f"{path.name}:{i + 1}"
        mark = _MARK.match(lines[i])
        fence = _FENCE.match(lines[i])
        if mark:
            end, first, setup = _comment(lines, i)
            text = _MARK.match(first)
            assert text is not None
            if text.group(1) == "examples":
                file_options |= _options(text.group(2), FILE_OPTIONS, where)
                pending = None
            else:
                pending = (_options(text.group(2), BLOCK_OPTIONS, where), setup)
            i = end + 1
            continue
        if fence:
            close = next((j for j in range(i + 1, len(lines))
                          if lines[j].strip() == fence.group(1)), None)
            if close is None:
                raise MarkdownError(f"{where}: fence never closed")
            options, setup = pending or ({}, "")
            blocks.append(Block(path, i + 1, fence.group(2), "\n".join(lines[i + 1:close]),
                                options, setup))
            i = close + 1
        elif pending is not None:
            raise MarkdownError(f"{where}: an example mark must be right above a fence")
        else:
            i += 1
        pending = None
    if pending is not None:
        raise MarkdownError(f"{path.name}: the last example mark has no fence below it")
    document = Document(path, blocks, file_options)
    _check(document, root)
    return document


def _check(document: Document, root: Path) -> None:
    names = [b.options["name"] for b in document.blocks if "name" in b.options]
    if len(names) != len(set(names)):
        raise MarkdownError(f"{document.path.name}: block names repeat: {names}")
    for block in document.blocks:
        if block.language not in RUNNABLE and block.language not in NOT_CODE:
            raise MarkdownError(
                f"{block.where}: a fence must name its language: one the examples harness "
                f"runs ({', '.join(sorted(RUNNABLE))}) or 'text' for output, got "
                f"{block.language or 'none'!r}")
        for name in block.after:
            if name not in names:
                raise MarkdownError(f"{block.where}: after={name}: no block has that name")
        covered = block.options.get("covered-by")
        if covered is not None:
            if not covered.split() or not (root / covered.split()[0]).exists():
                raise MarkdownError(f"{block.where}: covered-by must start with the repo file "
                                    f"that runs this block, got {covered!r}")
        elif "background" in block.options and len(block.code.strip().splitlines()) != 1:
            raise MarkdownError(f"{block.where}: a background block is one command")
