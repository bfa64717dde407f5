"""The README's numbers are what the tool prints: every generated region of README.md is made again
by bench/readme.py from the commands it names and compared, and every figure and claim of its
prose is checked against the same outputs.

By default this checks every block, fact and claim that needs no slow run (about 25 s on 2
cores); the `kvplan plan` searches, the 16-token Mooncake sweep, the Alpaca sharing replay, the
fidelity benches bench/timing_fidelity.py, sglang_fidelity.py, parallel_fidelity.py and
silicon_rows.py (about 10 minutes together) and `kvplan validate` (whose errors are
floating-point results of the machine's torch kernels) run with KVPLAN_README_ALL=1, and always in
`python bench/readme.py --check`. A block whose trace is not
in ../shared, or that needs torch (`kvplan validate`) where it is not installed, skips.
"""

from __future__ import annotations

import difflib
import os

import pytest

from tests.conftest import bench_module

readme = bench_module("readme")
ALL = os.environ.get("KVPLAN_README_ALL") == "1"
TEXT = readme.README.read_text(encoding="utf-8")


def checked(runs) -> None:
    """Skip unless every run can happen here and the default test includes it."""
    slow = [r for r in runs if readme.RUNS[r].slow]
    if slow and not ALL:
        pytest.skip(f"slow ({', '.join(slow)}): KVPLAN_README_ALL=1 checks it")
    why = readme.why_not(runs)
    if why:
        pytest.skip(why)


@pytest.fixture(scope="module")
def outputs() -> dict[str, str]:
    """Every run a checked block, fact or claim needs, each once (two at a time)."""
    return readme.run_all(r for r in readme.runs_of()
                          if readme.RUNS[r].missing() is None and (ALL or not readme.RUNS[r].slow))


def _shown(report) -> str:
    return "\n".join(f"{what}:\n" + "\n".join(difflib.unified_diff(old.splitlines(), new.splitlines(), "README.md",
                                                                  "the tool", lineterm="", n=1))
                     for what, old, new in report.differs)


def test_every_region_is_a_block_and_every_anchor_is_in_the_prose():
    """No run needed: the markers pair up and name the script's blocks (each once), and the prose
    still says what every fact and claim stands for."""
    report = readme.compare(TEXT, {}, facts=[], claims=[])
    assert report.problems == [] and report.differs == []
    prose = readme.squash(readme.outside(TEXT))
    for name, fact in readme.FACTS.items():
        assert readme.re.search(fact.pattern, readme.outside(TEXT)), f"fact {name}: {fact.pattern!r} not in README.md"
    for name, claim in readme.CLAIMS.items():
        assert readme.squash(claim.words) in prose, f"claim {name}: {claim.words!r} not in README.md"


@pytest.mark.parametrize("name", list(readme.BLOCKS))
def test_the_block_is_what_the_tool_prints(outputs, name):
    checked(readme.BLOCKS[name].runs)
    report = readme.compare(TEXT, outputs, blocks=[name], facts=[], claims=[])
    assert report.problems == [], report.problems
    assert report.differs == [], "regenerate with `python bench/readme.py`:\n" + _shown(report)


@pytest.mark.parametrize("name", list(readme.FACTS))
def test_the_figure_in_the_prose_is_what_the_tool_prints(outputs, name):
    checked(readme.FACTS[name].runs)
    report = readme.compare(TEXT, outputs, blocks=[], facts=[name], claims=[])
    assert report.problems == [], report.problems
    assert report.differs == [], "regenerate with `python bench/readme.py`:\n" + _shown(report)


@pytest.mark.parametrize("name", list(readme.CLAIMS))
def test_the_claim_of_the_prose_still_holds(outputs, name):
    checked(readme.CLAIMS[name].runs)
    report = readme.compare(TEXT, outputs, blocks=[], facts=[], claims=[name])
    assert report.problems == []


def test_a_number_changed_by_hand_is_caught_and_regenerated(outputs):
    """A README whose table, console output or prose says another number fails, and the rewrite
    puts back what the tool prints."""
    checked(("lesson-sweep", "lesson", "models"))
    edits = [("| admitted | 122 | 122 |", "| admitted | 123 | 122 |"),  # a derived table
             ("│ paged-B16      │      122 │", "│ paged-B16      │      121 │"),  # a console block
             ("(146 models;", "(145 models;")]  # a figure in the prose
    for old, new in edits:
        assert TEXT.count(old) == 1, old
        wrong = TEXT.replace(old, new)
        report = readme.compare(wrong, outputs, blocks=["lesson-sweep", "lesson"], facts=["models"], claims=[])
        assert len(report.differs) == 1 and report.problems == [], report.differs
        assert report.text == TEXT


def test_a_region_without_its_block_or_its_end_is_a_problem():
    start = "<!-- kvplan-readme: lesson-sweep -->"
    for wrong in (TEXT.replace(start, "<!-- kvplan-readme: lesson-sweeps -->"),
                  TEXT.replace(start, ""),
                  TEXT.replace(start, start + "\n" + start, 1),
                  TEXT.replace("<!-- /kvplan-readme -->", "", 1),
                  TEXT + "\n<!-- /kvplan-readme -->\n"):
        assert readme.compare(wrong, {}, facts=[], claims=[]).problems


def test_check_exits_1_on_a_difference(tmp_path, monkeypatch):
    """`--check` reads README.md, compares, and exits 1 (the file untouched) when a number differs;
    the rewrite fixes it, atomically."""
    checked(("lesson-sweep",))
    path = tmp_path / "README.md"
    path.write_text(TEXT.replace("| admitted | 122 | 122 |", "| admitted | 123 | 122 |"), encoding="utf-8")
    monkeypatch.setattr(readme, "README", path)
    assert readme.main(["--check", "--only", "lesson-sweep"]) == 1
    assert "| admitted | 123 | 122 |" in path.read_text(encoding="utf-8")
    assert readme.main(["--only", "lesson-sweep"]) == 0
    assert path.read_text(encoding="utf-8") == TEXT and [p.name for p in tmp_path.iterdir()] == ["README.md"]
    assert readme.main(["--check", "--only", "lesson-sweep"]) == 0


def test_sglang_own_reads_the_held_out_row_of_sglangs_own_rules():
    """bench/sglang_fidelity.py prints 'all but bursts' twice: first beside vLLM's restatement, then
    under "SGLang's own, leave-one-source-out"; the README's row is the second one's first column."""
    text = "\n".join([
        "median |error| overall",
        "                                  |        vLLM's restatement        |       SGLang's own, shipped      ",
        "all but bursts                 56  |   7.9%   20.2%   22.6%   23.2% |   7.3%   19.9%   18.6%   21.1% ",
        "                                  | SGLang's own, leave-one-source-out|    SGLang's own, refit on all    ",
        "                                  | thr     E2E     TTFT    ITL      | thr     E2E     TTFT    ITL      ",
        "all but bursts                 56  |   1.0%    2.0%    3.0%    4.0% |   5.0%    6.0%    7.0%    8.0% ",
    ])
    assert readme.sglang_own(text) == (56, ["1.0%", "2.0%", "3.0%", "4.0%"])
    with pytest.raises(readme.ProseError):
        readme.sglang_own(text.replace("leave-one-source-out", "held out"))
