"""Hostile text and narrow consoles (issue 29): what a file or a flag names is shown literally.

A model folder, a workload's `name:` or a price row may hold terminal escape sequences (clear the
screen, set the window title), rich markup (`x[/]y` raised rich's MarkupError), matplotlib
mathtext (`$\\foo{$x` crashed the chart of `plan --html` and `simulate --plot`) or a `javascript:`
link: kvplan/text.py is the one sanitiser. Tables piped at 80 or 60 columns keep every number
whole, $COLUMNS that is no width is ignored, and a closed stdout is one error line.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

from kvplan import text

ROOT = Path(__file__).resolve().parents[1]
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
ESC, BEL = "\x1b", "\x07"
# A name that is every kind of hostile at once (no "/": a folder of this name is one path part).
HOSTILE = f"x[/]y [bold red]z $\\foo{{$x {ESC}[2J {ESC}]0;pwned{BEL} :smile: <b>&amp;"
FOLDER = HOSTILE.replace("x[/]y ", "")  # a folder's name holds no "/"
SHOWN = text.printable(HOSTILE)  # what a terminal must show: the escapes as text, all else as written


@pytest.fixture
def cli(run_cli, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("KVPLAN_DEBUG", raising=False)
    monkeypatch.delenv("COLUMNS", raising=False)
    return run_cli


def hostile_model(tmp_path: Path) -> Path:
    """A model folder named FOLDER, holding the catalog's Llama-3.1-8B config."""
    folder = tmp_path / FOLDER
    folder.mkdir()
    folder.joinpath("config.json").write_text((ROOT / "models" / MODEL / "config.json").read_text())
    return folder


def assert_literal(out: str, name: str = HOSTILE) -> None:
    assert ESC not in out and BEL not in out, "a raw escape sequence reached the terminal"
    # compared without whitespace: a terminal may fold a long path anywhere, even inside the name
    assert "".join(text.printable(name).split()) in "".join(out.split()), "the name is not shown as it is written"


# ---- the sanitiser ------------------------------------------------------------------------------


def test_printable_shows_controls_as_escapes_and_keeps_the_rest():
    assert text.printable(f"a{ESC}[2Jb{ESC}]0;t{BEL}\u202e\x9b\n") == "a\\x1b[2Jb\\x1b]0;t\\x07\\u202e\\x9b\\n"
    assert text.printable("naïve [x] $y") == "naïve [x] $y"


def test_terminal_text_prints_literally_through_rich():
    from rich.console import Console
    from rich.table import Table

    console = Console(width=200, file=open(os.devnull, "w"), record=True, emoji=False)
    table = Table(title=text.terminal(HOSTILE))
    table.add_column(text.terminal("[red]x"))
    table.add_row(text.terminal(HOSTILE + "\\"))  # a trailing backslash must not escape the markup's end
    console.print(table)
    console.print(f"[dim]{text.terminal(HOSTILE)}[/dim]")
    shown = console.export_text()
    assert shown.count(SHOWN) == 3 and SHOWN + "\\" in shown and "[red]x" in shown and ESC not in shown


@pytest.mark.parametrize("url", ["javascript:alert(document.domain)", "JavaScript:alert(1)", " javascript:alert(1)",
                                 "java\tscript:alert(1)", "data:text/html,<script>", "vbscript:x", "file:///etc/passwd",
                                 "//evil.example/x", "https:", "http:///x", "relative/page.html", None, 3])
def test_only_absolute_http_urls_become_links(url):
    assert "<a " not in text.html_link(url) and "href" not in text.html_link(url)


def test_an_http_url_is_a_link_with_its_quotes_escaped():
    link = text.html_link('https://example.org/?a=1&b="><script>')
    assert link.startswith('<a href="https://example.org/?a=1&amp;b=&quot;&gt;&lt;script&gt;"') and "<script" not in link


def test_a_plot_label_is_never_mathtext():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.set_title(text.plot_label(HOSTILE))
    ax.plot([0, 1], [0, 1], label=text.plot_label("a\\$b $c$"))
    ax.legend()
    fig.canvas.draw()  # mathtext of the raw name raises ValueError here
    assert ax.get_title() == text.plot_label(HOSTILE)
    plt.close(fig)


def test_plurals():
    assert [text.count(n, "configuration") for n in (0, 1, 2, 1234)] == [
        "0 configurations", "1 configuration", "2 configurations", "1,234 configurations"]


# ---- hostile names through the commands -----------------------------------------------------------


def test_size_shows_a_hostile_folder_name_literally(tmp_path, cli):
    model = hostile_model(tmp_path)
    for args in ([], ["--gpu", "H100-80GB"], ["--gpu", "H100-80GB,L4"]):
        code, out, err = cli("size", str(model), *args)
        assert code == 0, err
        assert_literal(out, FOLDER)


def test_simulate_shows_a_hostile_workload_name_and_plots_it(tmp_path, cli):
    workload = tmp_path / "w.yaml"
    workload.write_text("experiment: serve\nname: " + json.dumps(HOSTILE) + "\npool: {slots: 100000}\n"
                        "requests:\n  count: 50\n  prompt: {dist: fixed, value: 10}\n  output: {dist: fixed, value: 5}\n"
                        "  arrival: {process: poisson, rate: 2.0}\n", encoding="utf-8")
    plot = tmp_path / "chart.svg"
    code, out, err = cli("simulate", str(workload), "--plot", str(plot))
    assert code == 0, err
    assert_literal(out)
    assert plot.stat().st_size > 0


class _Table(HTMLParser):
    """The header cells and the body rows of the report's ranked table."""

    def __init__(self):
        super().__init__()
        self.head, self.rows, self.where, self.cell = [], [], None, None

    def handle_starttag(self, tag, attrs):
        if tag in ("thead", "tbody"):
            self.where = tag
        elif tag == "tr" and self.where == "tbody":
            self.rows.append([])
        elif tag in ("td", "th"):
            self.cell = ""

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self.cell is not None:
            (self.head if self.where == "thead" else self.rows[-1]).append(self.cell)
            self.cell = None
        elif tag == "table":
            self.where = None

    def handle_data(self, data):
        if self.cell is not None:
            self.cell += data


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    """One cheap plan (50 requests, no fresh samples, no fleet check) of a hostile model folder,
    priced by a hostile provider, on a GPU that meets the target and one that cannot (L4: one
    request alone misses the TTFT target), with its HTML report and chart."""
    from kvplan.cli import main

    tmp = tmp_path_factory.mktemp("plan")
    model = hostile_model(tmp)
    prices = tmp / "prices.json"
    prices.write_text(json.dumps({"prices": [
        {"gpu": "H100-80GB", "usd_per_gpu_hour": 2.5, "provider": HOSTILE, "date": "2026-12-01",
         "source": 'https://example.org/"><script>alert(1)</script>'},
        {"gpu": "L4", "usd_per_gpu_hour": 0.8, "provider": "p", "date": "2026-12-01", "source": "https://example.org/"}]}))
    report, chart = tmp / "report.html", tmp / "chart.svg"
    args = ["plan", str(model), "--rate", "2", "--prompt", "1000", "--output", "10", "--count", "50", "--ttft-p99", "0.1",
            "--prices", str(prices), "--tp", "1", "--workers", "1", "--check-seeds", "0", "--router", "none",
            "--html", str(report), "--plot", str(chart)]
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return args, main, report, chart


def test_plan_shows_hostile_names_literally_and_links_nothing_but_http(planned, capsys):
    args, main, report, chart = planned
    with pytest.raises(SystemExit) as stop:
        main(args)
    out = capsys.readouterr().out
    assert stop.value.code == 0
    assert_literal(out)
    html = report.read_text(encoding="utf-8")
    assert ESC not in html and "<script" not in html and 'href="javascript' not in html.lower()
    assert text.html_text(HOSTILE) in html and text.html_text(FOLDER) in html  # the provider, the model
    assert chart.stat().st_size > 0
    parser = _Table()
    parser.feed(html)
    reason = parser.head.index("why not")
    assert len(parser.head) == 14 and all(len(row) == len(parser.head) for row in parser.rows)
    infeasible = [row for row in parser.rows if row[1].startswith("L4")]
    assert infeasible and "TTFT target" in infeasible[0][reason]
    assert all(cell == "-" for cell in infeasible[0][2:reason])  # no reason under a metric's header


def test_one_configuration_is_singular(run_cli, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"prices": [{"gpu": "H100-80GB", "usd_per_gpu_hour": 2.5}]}))
    code, out, err = run_cli("plan", MODEL, "--rate", "2", "--prompt", "100", "--output", "10", "--count", "50",
                             "--ttft-p99", "1", "--prices", str(prices), "--tp", "1", "--workers", "1",
                             "--check-seeds", "0", "--router", "none")
    assert code == 0, err
    flat = " ".join(out.split())
    assert "(1 of 1 configuration planned" in flat and "1 configuration:" in flat and "configurations" not in flat


# ---- tables on a pipe: no number cut ------------------------------------------------------------


def _lines(out: str) -> list[str]:
    return [" ".join(line.split()) for line in out.splitlines()]


def _whole(value: str, out: str) -> bool:
    """`value` appears on one line of `out`, between cell borders or spaces."""
    return any(re.search(rf"(^|[\s│┃]){re.escape(value)}($|[\s│┃])", line) for line in _lines(out))


@pytest.mark.parametrize("columns", ["80", "60"])
def test_the_model_catalog_keeps_every_number_whole(cli, monkeypatch, columns):
    from kvplan.units import format_bytes

    code, out, _ = cli("models", "--json")
    rows = json.loads(out)["models"]
    monkeypatch.setenv("COLUMNS", columns)
    code, out, err = cli("models")
    assert code == 0, err
    assert "…" not in out
    if columns == "80":  # at 60, the longest id and one column beside it are wider: a longer line, no cut
        assert max(len(line) for line in out.splitlines()) <= 80
    for row in rows:
        expected = [row["model"], row["model_type"], str(row["num_layers"]), format_bytes(row["bytes_per_token"]),
                    f"{row['max_context']:,}" if row["max_context"] else "none stated", row["dtype"]]
        missing = [value for value in expected if not _whole(value, out)]
        assert not missing, f"{row['model']}: cut or split {missing}"


@pytest.mark.parametrize("columns", ["80", "60"])
def test_the_gpu_catalog_keeps_every_number_whole(cli, monkeypatch, columns):
    from kvplan.units import format_bytes

    code, out, _ = cli("gpus", "--json")
    rows = json.loads(out)["gpus"]
    monkeypatch.setenv("COLUMNS", columns)
    code, out, err = cli("gpus")
    assert code == 0, err
    for row in rows:
        for value in (row["name"], format_bytes(row["memory_bytes"]), format_bytes(row["cuda_memory_bytes"]),
                      f"{row['hbm_bytes_per_s'] / 1e12:.2f} TB/s"):
            assert _whole(value, out), value


def _values(out: str) -> list[str]:
    """The value cells (the last column) of the first table of `out`."""
    return [cells[-2].strip() for cells in (line.split("│") for line in out.splitlines())
            if len(cells) >= 3 and cells[-2].strip()]


@pytest.mark.parametrize("columns", ["80", "60"])
@pytest.mark.parametrize("args", [["llama-3.1-70b", "--gpu", "H100-80GB"], ["llama-3.1-8b", "--gpu", "H100-80GB"]])
def test_the_size_table_keeps_values_whole_and_wraps_labels(cli, monkeypatch, args, columns):
    monkeypatch.setenv("COLUMNS", "400")
    _, wide, _ = cli("size", *args)
    values = _values(wide)
    assert any("GiB" in v for v in values) and any("params" in v for v in values)
    monkeypatch.setenv("COLUMNS", columns)
    code, out, err = cli("size", *args)
    assert code == 0, err
    assert _values(out)[: len(values)] != [] and "…" not in out
    missing = [v for v in values if v not in _values(out)]
    assert not missing, f"split at {columns} columns: {missing}"
    if columns == "80":
        assert max(len(line) for line in out.splitlines()) <= 80


def test_examples_wrap_their_prose_and_keep_names_whole(cli, monkeypatch):
    from kvplan.workload.examples import list_examples

    monkeypatch.setenv("COLUMNS", "80")
    code, out, err = cli("examples")
    assert code == 0, err
    assert max(len(line) for line in out.splitlines()) <= 80
    for e in list_examples():
        assert _whole(e.name, out) and _whole(e.experiment, out)


# ---- the environment and closed streams ---------------------------------------------------------


@pytest.mark.parametrize("columns", ["0", "00", "-5", "abc", "", "²", "9" * 5000])
def test_a_columns_that_is_no_width_is_ignored(cli, monkeypatch, columns):
    monkeypatch.setenv("COLUMNS", columns)
    monkeypatch.setenv("LINES", columns)
    code, out, err = cli("size", "llama-3.1-8b")
    assert code == 0, err
    assert "KV cache of llama-3.1-8b" in out and "bytes per token" in out and "131,072 B (128 KiB)" in out


def _shell(command: str) -> subprocess.CompletedProcess:
    """`python -m kvplan ...` run by the shell (so that `>&-` closes a descriptor for it)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    env.pop("KVPLAN_DEBUG", None)
    return subprocess.run(f'"{sys.executable}" -m kvplan {command}', shell=True, cwd=ROOT, env=env, text=True,
                          stderr=subprocess.PIPE, timeout=120)


@pytest.mark.parametrize("command", ["examples", "examples --json", "schema", "--version", "size llama-3.1-8b"])
def test_a_closed_stdout_is_one_error_line(command):
    run = _shell(command + " >&-")
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert run.stderr.strip().splitlines() == ["kvplan: error: cannot write the output: standard output is closed"]


def test_closed_streams_give_an_exit_code_and_no_traceback(tmp_path):
    assert _shell("size no-such-model >&-").returncode == 2  # the error goes to stderr, which is open
    run = subprocess.run(f'"{sys.executable}" -m kvplan size no-such-model 2>&-', shell=True, cwd=ROOT, text=True,
                         stdout=subprocess.PIPE, env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)},
                         timeout=120)
    assert run.returncode == 2 and run.stdout == ""
    csv = tmp_path / "rows.csv"  # a file opened with stdout closed never takes its descriptor
    workload = tmp_path / "w.yaml"
    workload.write_text("experiment: serve\npool: {slots: 100000}\nrequests:\n  count: 20\n"
                        "  prompt: {dist: fixed, value: 10}\n  output: {dist: fixed, value: 5}\n"
                        "  arrival: {process: poisson, rate: 2.0}\n")
    run = _shell(f"simulate {workload} --csv {csv} >&- 2>&-")
    assert run.returncode == 2 and run.stderr == ""
    assert not csv.exists() or csv.read_text().startswith("allocator,request")


# ---- CSV outputs: no cell a spreadsheet would run -------------------------------------------------


def test_csv_cells_never_start_a_formula():
    for hostile in ("=HYPERLINK(\"http://x\",\"y\")", "+1+1", "-2+3", "@SUM(A1)", "\tx", "\rx"):
        assert text.csv_cell(hostile) == "'" + hostile
    assert [text.csv_cell(v) for v in ("H100-80GB tp2", "", 3, -2.5, None, True)] == ["H100-80GB tp2", "", 3, -2.5, None, True]


def test_the_plan_csv_guards_every_text_cell(tmp_path):
    import csv

    from kvplan.report.plan_view import CSV_FIELDS, write_plan_csv

    row = {"config": {"label": "=cmd|' /C calc'!A0", "gpu": "@x", "tp": 1, "quantization": "none", "kv_dtype": "-bf16",
                      "max_num_seqs": None, "block_size": 16, "prefix_caching": True},
           "feasible": False, "simulated": False, "replicas": 1, "gpus": 1, "usd_per_gpu_hour": 2.5, "cost_per_hour": 2.5,
           "usd_per_million_tokens": None, "usd_per_million_output_tokens": None, "served": 0, "load_per_replica": 0,
           "capacity": 0, "saturated": False, "ttft_p99": None, "tpot_p99": None, "e2e_p99": None,
           "bound_cost": None, "bound_ttft": None, "reason": "+ SUM(1)"}
    out = tmp_path / "plan.csv"
    write_plan_csv({"results": [row]}, out)
    cells = list(csv.reader(out.open(encoding="utf-8")))[1]
    assert len(cells) == len(CSV_FIELDS)
    assert not [c for c in cells if c and c[0] in "=+-@\t\r"], cells
    assert cells[1] == "'=cmd|' /C calc'!A0" and cells[-1] == "'+ SUM(1)"
