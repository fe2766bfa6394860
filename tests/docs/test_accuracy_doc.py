"""docs/accuracy.md is rendered, not edited: scripts/render_accuracy.py fills its template (docs/accuracy.md.in) with
the figures the benches recorded (docs/figures/*.json, written by bench/_figures.py when a bench runs with
`--record`), and README.md's accuracy and speed tables from theirs (docs/readme-accuracy.md.in).

- The committed docs/accuracy.md is exactly the render of the committed template and figures, and README.md's
  tables are (the prose around them is its own).
- Every figures file names its bench (an existing bench/<bench>.py), the command line that printed its figures and
  the ISO date it ran, and the template quotes it.
- What `record` writes, the renderer reads back; a placeholder naming no value is an error naming it and its line.
"""

from __future__ import annotations

import argparse
import datetime
import difflib
import importlib.util
import json
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIGURES = ROOT / "docs" / "figures"


def _load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and the like look their module up
    spec.loader.exec_module(module)
    return module


render_accuracy = _load("render_accuracy", ROOT / "scripts" / "render_accuracy.py")
figures = _load("_figures", ROOT / "bench" / "_figures.py")


def test_the_committed_accuracy_doc_is_the_render_of_its_template_and_figures():
    committed = (ROOT / "docs" / "accuracy.md").read_text(encoding="utf-8")
    rendered = render_accuracy.rendered()
    diff = "".join(difflib.unified_diff(committed.splitlines(keepends=True), rendered.splitlines(keepends=True),
                                        "docs/accuracy.md", "rendered", n=1))
    assert committed == rendered, f"run `make docs` (docs/accuracy.md is generated):\n{diff[:4000]}"
    assert committed.startswith(render_accuracy.HEADER + "\n")
    assert "{{" not in committed and "{#" not in committed


def test_the_readmes_accuracy_tables_are_the_render_of_their_template_and_figures():
    committed = (ROOT / "README.md").read_text(encoding="utf-8")
    rendered = render_accuracy.rendered_readme(committed)
    diff = "".join(difflib.unified_diff(committed.splitlines(keepends=True), rendered.splitlines(keepends=True),
                                        "README.md", "rendered", n=1))
    assert committed == rendered, f"run `make docs` (README.md's accuracy tables are generated):\n{diff[:4000]}"
    tables = committed.split(render_accuracy.README_BEGIN)[1].split(render_accuracy.README_END)[0]
    assert "| what is judged" in tables and "| what a scheduler asks" in tables
    assert "{{" not in committed and "{#" not in committed


def test_only_what_stands_between_the_readmes_markers_is_rendered():
    begin, end = render_accuracy.README_BEGIN, render_accuracy.README_END
    readme = f"# title\n\nprose {{{{ kept }}}}\n{begin}\n| old | table |\n{end}\n\nmore prose\n"
    assert render_accuracy.spliced(readme, "| new | table |\n") == (
        f"# title\n\nprose {{{{ kept }}}}\n{begin}\n| new | table |\n{end}\n\nmore prose\n")
    for broken in ("# title\n\nno markers\n", f"{end}\n{begin}\n"):
        with pytest.raises(render_accuracy.RenderError, match="README.md has no line"):
            render_accuracy.spliced(broken, "| new | table |\n")


def test_every_figures_file_names_its_bench_its_command_and_its_date():
    paths = sorted(FIGURES.glob("*.json"))
    assert len(paths) >= 20
    template = (ROOT / "docs" / "accuracy.md.in").read_text(encoding="utf-8")
    quoted = {match.group(1).split(".")[0] for match in render_accuracy.PLACEHOLDER.finditer(template)}
    for path in paths:
        data = json.loads(path.read_text(encoding="utf-8"))
        where = path.relative_to(ROOT)
        assert set(data) == {"bench", "command", "date", "figures"}, where
        bench = data["bench"]
        assert (ROOT / "bench" / f"{bench}.py").is_file(), f"{where}: no bench/{bench}.py"
        assert path.stem == bench or path.stem.startswith(f"{bench}-"), f"{where}: named after bench {bench}"
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", data["date"]), f"{where}: date {data['date']!r} is not ISO"
        assert datetime.date.fromisoformat(data["date"]) <= datetime.date.today(), where
        assert data["command"].startswith(f".venv/bin/python bench/{bench}.py"), f"{where}: {data['command']!r}"
        assert isinstance(data["figures"], dict) and data["figures"], f"{where}: no figures"
        assert path.stem in quoted, f"{where}: the template quotes none of its figures"


def test_record_writes_what_the_renderer_reads(tmp_path):
    import numpy as np

    path = figures.record("fleet", {"same_gpu": {"k0": {"one_gpu_mape_pct": np.float64(28.71234)}}, "runs": 12},
                          command=".venv/bin/python bench/fleet.py --cache FILE", directory=tmp_path)
    assert path == tmp_path / "fleet.json"
    assert [p.name for p in tmp_path.iterdir()] == ["fleet.json"]  # the temporary file was renamed, not left
    data = json.loads(path.read_text(encoding="utf-8"))
    assert data == {"bench": "fleet", "command": ".venv/bin/python bench/fleet.py --cache FILE",
                    "date": datetime.date.today().isoformat(),
                    "figures": {"same_gpu": {"k0": {"one_gpu_mape_pct": 28.7123}}, "runs": 12}}

    template = "{# a note for the template's editors #}\n`{{ fleet.command }}` ({{ fleet.date }}): " \
               "{{ fleet.same_gpu.k0.one_gpu_mape_pct:.1f }} % over {{ fleet.runs:, }} runs\n"
    text = render_accuracy.render(template, render_accuracy.load_figures(tmp_path))
    assert text == (f"{render_accuracy.HEADER}\n`.venv/bin/python bench/fleet.py --cache FILE` "
                    f"({datetime.date.today().isoformat()}): 28.7 % over 12 runs\n")


def test_a_run_of_a_bench_is_its_own_file_and_its_command_is_the_command_line(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", [str(ROOT / "bench" / "whole_model.py"), "--store", "URL", "--before",
                                      "--record", "before"])
    parser = argparse.ArgumentParser()
    figures.add_record_option(parser)
    parser.add_argument("--store")
    parser.add_argument("--before", action="store_true")
    args = parser.parse_args(sys.argv[1:])
    assert args.record == "before"
    monkeypatch.setenv(figures.FIGURES_DIR_ENV, str(tmp_path))
    path = figures.record_if_asked(args, "whole_model", {"all": {"mape_pct": 21.2}})
    assert path == tmp_path / "whole_model-before.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    assert data["command"] == ".venv/bin/python bench/whole_model.py --store URL --before"
    runs = render_accuracy.load_figures(tmp_path)
    assert render_accuracy.lookup(runs, "whole_model-before.all.mape_pct") == 21.2

    assert parser.parse_args(["--record"]).record == ""  # the bench's own file
    assert figures.record_if_asked(parser.parse_args([]), "whole_model", {"all": {}}) is None
    with pytest.raises(ValueError, match="opt-1.3b"):
        figures.record("whole_model", {"opt-1.3b": 1.0}, directory=tmp_path)
    assert figures.figure_key("opt-1.3b") == "opt-1_3b" and figures.figure_key("RTX 3090") == "RTX_3090"


def test_a_group_may_keep_the_date_of_another_run():
    runs = {"placement_fit": {"bench": "placement_fit", "command": "c", "date": "2026-11-22",
                              "figures": {"adaptdl": {"date": "2026-11-21", "mape_pct": 11.8},
                                          "vtrain": {"mape_pct": 9.7}}}}
    assert render_accuracy.lookup(runs, "placement_fit.adaptdl.date") == "2026-11-21"
    assert render_accuracy.lookup(runs, "placement_fit.vtrain.date") == "2026-11-22"
    assert render_accuracy.lookup(runs, "placement_fit.date") == "2026-11-22"


@pytest.mark.parametrize(("placeholder", "said"), [
    ("{{ fleet.same_gpu.k9.one_gpu_mape_pct:.1f }}", "no same_gpu.k9"),
    ("{{ nothing.mape_pct }}", "no figures file docs/figures/nothing.json"),
    ("{{ fleet.same_gpu:.1f }}", "cannot format"),
])
def test_a_placeholder_naming_no_value_is_an_error_naming_it_and_its_line(placeholder, said):
    runs = {"fleet": {"bench": "fleet", "command": "c", "date": "2026-11-24",
                      "figures": {"same_gpu": {"k0": {"one_gpu_mape_pct": 28.7}}}}}
    template = "# title\n\nfine: {{ fleet.same_gpu.k0.one_gpu_mape_pct:.1f }}, then " + placeholder + "\n"
    with pytest.raises(render_accuracy.RenderError) as raised:
        render_accuracy.render(template, runs)
    assert f"docs/accuracy.md.in:3: {placeholder}" in str(raised.value)
    assert said in str(raised.value)


def test_a_figures_file_without_its_fields_is_refused(tmp_path):
    (tmp_path / "fleet.json").write_text(json.dumps({"bench": "fleet", "figures": {}}), encoding="utf-8")
    with pytest.raises(render_accuracy.RenderError, match="command, date"):
        render_accuracy.load_figures(tmp_path)
