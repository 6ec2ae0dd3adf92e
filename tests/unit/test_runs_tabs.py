"""The Runs page's state tabs from their counts: exact, stopped at the cap, estimated (≈) or not
known (?), and the "all" tab that sums them."""

from __future__ import annotations

from notifyq._control import COUNT_CAP, RUN_STATES, Count
from notifyq._ui.render import environment
from notifyq._ui.runs import _tabs


def _shown(counts: dict[str, Count | None]) -> str:
    page = _tabs({"pool": "idle"}, counts)
    return environment().get_template("runs_tabs.html").render(**page, base="/ui", counted=True)


def test_exact_counts_show_as_numbers_and_a_capped_one_with_a_plus() -> None:
    counts: dict[str, Count | None] = dict.fromkeys(RUN_STATES, Count(0))
    counts |= {"pending": Count(3), "completed": Count(COUNT_CAP)}
    html = _shown(counts)
    assert 'data-state="pending">pending <span class="count">3</span>' in html
    assert 'data-state="completed">completed <span class="count">10,000+</span>' in html
    assert 'data-state="all">all <span class="count">10,003+</span>' in html
    assert "\u2248" not in html


def test_an_estimate_is_marked_and_makes_the_total_an_estimate() -> None:
    counts: dict[str, Count | None] = dict.fromkeys(RUN_STATES, Count(0))
    counts |= {"pending": Count(3), "timed_out": Count(2373, estimated=True)}
    html = _shown(counts)
    assert ('data-state="timed_out">timed out <span class="count estimated" title="an '
            'estimate: counting would read too long; narrow the filter with a time range">'
            '\u22482,373</span>') in html
    assert '<span class="count estimated"' in html.split('data-state="all">')[1].split("</a>")[0]
    assert "\u22482,376</span>" in html


def test_a_count_not_known_shows_a_question_mark_and_the_total_a_plus() -> None:
    counts: dict[str, Count | None] = dict.fromkeys(RUN_STATES, Count(1))
    counts["failed"] = None
    html = _shown(counts)
    assert html.count('class="count unknown"') == 1
    assert f'<span class="count">{len(RUN_STATES) - 1}+</span>' in html
