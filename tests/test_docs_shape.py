"""The docs say where things stand, briefly: README is what a user needs (at most 350 lines),
benchmarks/RESULTS.md opens with the current figures and every result file it names exists, and the
package's comments keep the why without the host-timed figures (those belong in RESULTS_LOG.md,
dated, beside their command)."""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TIMED = re.compile(r"\d[\d,.]*\s?(ms|µs|us|tok/s|GFLOP/s|GB/s)(?![\w/])")
# a measured ratio ("1.45x", "4-5x"; not a shape "576 x 1536"), a percentage said of a measurement, a host
# named beside a figure: host results too, which belong in RESULTS_LOG.md as much as timings do
RATIO = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?:-\d+(?:\.\d+)?)?\s?x(?!\w)(?!\s*\d)")
PERCENT = re.compile(r"\d+(?:\.\d+)?\s?%")
MEASURED = re.compile(r"\b(cost|costs|took|ran|runs|slower|faster|saved|saves|measured|rounded|varies|about|spent)\b")
HOST = re.compile(r"\b(EPYC|Xeon|Zen ?\d|AMX|Sapphire Rapids|Cooper Lake|Ice Lake|H100|H200|A100)\b")


def quotes_a_measurement(line: str) -> bool:
    figure = TIMED.search(line) or RATIO.search(line)
    return bool(figure or (PERCENT.search(line) and MEASURED.search(line))
                or (HOST.search(line) and PERCENT.search(line)))


def test_readme_is_at_most_350_lines():
    lines = (ROOT / "README.md").read_text().count("\n")
    assert lines <= 350, f"README.md has {lines} lines: move detail into docs/, history into benchmarks/RESULTS_LOG.md"


def test_results_opens_with_the_current_figures_and_names_only_files_that_exist():
    text = (ROOT / "benchmarks" / "RESULTS.md").read_text()
    head = text.split("\n## ", 2)
    assert len(head) > 1 and head[1].lstrip().startswith("Decode speed"), "the first section is the decode figures"
    first_table = head[1].split("\n\n")[1]
    assert first_table.startswith("| host | format | C |"), first_table[:80]
    assert not re.search(r"^## .*\(20\d\d-", text, re.M), "dated sections belong in RESULTS_LOG.md"
    named = set(re.findall(r"`([\w.-]+\.json)`", text))
    assert named, "the figures name the JSON they come from"
    missing = sorted(n for n in named if not (ROOT / "benchmarks" / "results" / n).exists())
    assert not missing, missing


def timed_comments(source: str) -> list[tuple[int, str]]:
    """(line, text) of each comment or docstring line that quotes a host-measured figure: a timing, a
    ratio, a percentage said of a measurement, or a host named beside a percentage."""
    hits = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        docstring = tok.type == tokenize.STRING and tok.string.lstrip("rbuRBU").startswith(('"""', "'''"))
        if tok.type == tokenize.COMMENT or docstring:
            hits += [(tok.start[0] + i, line.strip()) for i, line in enumerate(tok.string.splitlines())
                     if quotes_a_measurement(line)]
    return hits


def test_no_comment_of_the_package_quotes_a_host_timed_figure():
    hits = [f"{p.relative_to(ROOT)}:{n}: {line}" for p in sorted((ROOT / "sglang_dspark").rglob("*.py"))
            for n, line in timed_comments(p.read_text())]
    assert not hits, "host timings belong in benchmarks/RESULTS_LOG.md:\n" + "\n".join(hits)


def test_the_figure_check_sees_comments_and_docstrings_but_not_code():
    source = 'x = 1  # a step took 9 ms here\n"""Runs 2.5 tok/s."""\nLIMIT_MS = 5\ny = "3 ms"\n'
    assert [n for n, _ in timed_comments(source)] == [1, 2]


def test_the_figure_check_sees_ratios_percentages_and_hosts_but_not_shapes_or_settings():
    measured = ["# 1.45x faster here", "# cost 4-5x the heads path", "# rounded apart in about 5 % of rows",
                "# the Xeon lost 3 % to it", "# a verify of 7 drafts is 2.66x a plain step"]
    settled = ["# a weight of 576 x 1536", "# at most 0.2 % of the thread's time (LEARNER_FIT_SHARE)",
               "# needs an AMD EPYC Zen 4 or later", "# gamma x R candidates"]
    source = "\n".join(f"x{i} = 0  {c}" for i, c in enumerate(measured + settled)) + "\n"
    assert [n for n, _ in timed_comments(source)] == list(range(1, len(measured) + 1))


def test_architecture_reads_in_short_paragraphs():
    text = re.sub(r"```.*?```", "", (ROOT / "docs" / "ARCHITECTURE.md").read_text(), flags=re.S)
    longest = max(p.count("\n") + 1 for p in re.split(r"\n\s*\n", text))
    assert longest <= 20, f"a paragraph of {longest} lines in docs/ARCHITECTURE.md"
