"""The marks of tests/docs/markdown.py: what they give a block, and what they refuse."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.docs.markdown import MarkdownError, parse
from tests.support import ROOT
from tests.ui.conftest import CHROMIUM


def _doc(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "doc.md"
    path.write_text(text)
    return path


def test_a_block_gets_the_blocks_it_comes_after_then_its_setup_then_its_code(
        tmp_path: Path) -> None:
    document = parse(_doc(tmp_path, """\
<!-- examples: serve="--app myapp:app" -->
<!-- example: name=app file=myapp.py -->
```python
app = 1
```

<!-- example: after=app
extra = 2
-->
```python
print(app + extra)
```

```text
3
```
"""), ROOT)
    app, use, output = document.blocks
    assert document.options == {"serve": "--app myapp:app"}
    assert (app.options, app.line, use.line) == ({"name": "app", "file": "myapp.py"}, 3, 10)
    assert document.source(use) == "app = 1\nextra = 2\nprint(app + extra)"
    assert (use.runner, output.runner) == ("python", None)


@pytest.mark.parametrize(("text", "message"), [
    ("```\nls\n```\n", "must name its language"),
    ("```ruby\nputs 1\n```\n", "must name its language"),
    ("<!-- example: after=nothing -->\n```sh\nls\n```\n", "no block has that name"),
    ("<!-- example: covered-by=nowhere/file -->\n```sh\nls\n```\n",
     "covered-by must start with the repo file"),
    ("<!-- example: file=x.py -->\n\n```python\n1\n```\n", "right above a fence"),
    ("<!-- example: retries=3 -->\n```sh\nls\n```\n", "unknown option 'retries'"),
    ("<!-- example: background -->\n```sh\nls\nls\n```\n", "one command"),
    ("```sh\nls\n", "never closed"),
])
def test_a_block_that_cannot_run_as_marked_is_refused_with_its_line(
        tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(MarkdownError, match=message):
        parse(_doc(tmp_path, text), ROOT)


def test_a_covered_block_names_a_file_of_the_repo_and_does_not_run(tmp_path: Path) -> None:
    [block] = parse(_doc(tmp_path, '<!-- example: covered-by=".ci/run (wheel job)" -->\n'
                                   "```sh\npip install .\n```\n"), ROOT).blocks
    assert block.runner is None


def test_the_readmes_test_section_names_every_program_the_tests_look_for() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Running the tests", 1)[1].split("\n## ", 1)[0]
    looked_for = {name for path in (ROOT / "tests").rglob("*.py")
                  for name in re.findall(r'shutil\.which\("([\w.-]+)"\)', path.read_text())}
    programs = looked_for | {Path(CHROMIUM).name}
    assert programs >= {"pg_dump", "curl", "pgbouncer", "chromium"}  # the search still works
    missing = sorted(p for p in programs if p not in section.lower())
    assert missing == [], f"README.md's 'Running the tests' does not name {missing}"
