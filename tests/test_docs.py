"""The documentation holds what the code does: README.md and docs/*.md.

- Every HTTP example of docs/api.md is sent, in the order written, to the real app (a fresh SQLite store, a private
  copy of the shipped models, the graph captured for real): each answers with its documented status, a 2xx, and
  every key of the documented response is in the real one (values may differ: they are this machine's).
- Every route of the app has an example there.
- Every relative link of README.md and docs/*.md names an existing file (and, with `#anchor`, one of its headings).
- Neither names issue numbers; README.md stays a short guide.

The examples' format in docs/api.md (the markers are HTML comments, invisible once rendered):

    <!-- request: POST /v1/jobs -->              the method and path; then, optionally, the body in a fenced
    ```json                                      block: `json` (sent as JSON) or `yaml` (sent as
    {"source": ...}                              application/yaml)
    ```
    <!-- response: 201 JOB_ID=job_id -->         the status, and values to keep for later examples: NAME=key.path
    ```json                                      of the response; then, optionally, the response: `json`
    {"job_id": "...", ...}                       (its keys are checked) or `text` (Prometheus: its metric names
    ```                                          are checked); no block: only the status is

A kept NAME (upper case, e.g. JOB_ID) stands for its value in later paths and in JSON bodies (a string equal to it).

The documented answers are the shipped models' (`drifted`). After a change of the models, rewrite them from what the
app answers: `PERFMODEL_REFRESH_API_DOCS=1 make test PYTEST_ARGS="tests/test_docs.py -k api_example"` (every number
of a drifted response, to four significant digits; review the diff).
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
API_DOC = DOCS / "api.md"
README_MAX_LINES = 300

MARKER = re.compile(r"^<!-- (request|response): (.*?) -->\s*$")
FENCE = re.compile(r"^```(\w*)\s*$")
PLACEHOLDER = re.compile(r"\b[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+\b")
ISSUE_REFERENCE = re.compile(r"\bissues?\s*#?\s*\d+|\bthis session\b", re.IGNORECASE)


@dataclass
class Example:
    line: int
    method: str
    path: str
    body: str | None = None
    body_lang: str = ""
    status: int = 0
    keep: dict[str, str] = field(default_factory=dict)
    response: str | None = None
    response_lang: str = ""

    def __str__(self) -> str:
        return f"docs/api.md:{self.line} {self.method} {self.path}"


def _block_after(lines: list[str], start: int) -> tuple[str, str | None, int]:
    """The fenced block right after line `start` (blank lines skipped): (language, text, next line); text None
    when none follows."""
    i = start + 1
    while i < len(lines) and not lines[i].strip():
        i += 1
    opened = FENCE.match(lines[i]) if i < len(lines) else None
    if not opened:
        return "", None, start + 1
    end = i + 1
    while end < len(lines) and lines[end].strip() != "```":
        end += 1
    assert end < len(lines), f"docs/api.md:{i + 1}: the fenced block is never closed"
    return opened.group(1), "\n".join(lines[i + 1:end]), end + 1


def parse_examples(text: str) -> list[Example]:
    """The request/response pairs of docs/api.md, in order."""
    lines = text.splitlines()
    examples: list[Example] = []
    pending: Example | None = None
    i = 0
    while i < len(lines):
        marker = MARKER.match(lines[i])
        if not marker:
            i += 1
            continue
        kind, spec = marker.groups()
        lang, block, after = _block_after(lines, i)
        if kind == "request":
            assert pending is None, f"docs/api.md:{i + 1}: a request before the response of {pending}"
            method, _, path = spec.strip().partition(" ")
            assert method in {"GET", "POST", "PUT", "PATCH", "DELETE"} and path.startswith("/"), \
                f"docs/api.md:{i + 1}: expected `request: METHOD /path`, got {spec!r}"
            pending = Example(i + 1, method, path.strip(), block, lang)
        else:
            assert pending is not None, f"docs/api.md:{i + 1}: a response with no request before it"
            status, *keep = spec.split()
            pending.status = int(status)
            pending.keep = dict(item.split("=", 1) for item in keep)
            pending.response, pending.response_lang = block, lang
            examples.append(pending)
            pending = None
        i = after
    assert pending is None, f"{pending}: no response marker follows"
    return examples


def _substitute(value: Any, kept: dict[str, Any]) -> Any:
    if isinstance(value, str) and value in kept:
        return kept[value]
    if isinstance(value, dict):
        return {k: _substitute(v, kept) for k, v in value.items()}
    if isinstance(value, list):
        return [_substitute(v, kept) for v in value]
    return value


def _substitute_path(path: str, kept: dict[str, Any]) -> str:
    def replace(match: re.Match[str]) -> str:
        assert match.group(0) in kept, f"{path}: {match.group(0)} is kept by no earlier example"
        return str(kept[match.group(0)])

    return PLACEHOLDER.sub(replace, path)


def missing_keys(documented: Any, real: Any, where: str = "") -> list[str]:
    """Where the documented JSON has a key (or an item holding keys) that the real one lacks."""
    if isinstance(documented, dict):
        if not isinstance(real, dict):
            return [where or "(top)"]
        missing = []
        for key, value in documented.items():
            if key not in real:
                missing.append(f"{where}.{key}" if where else key)
            else:
                missing += missing_keys(value, real[key], f"{where}.{key}" if where else key)
        return missing
    if isinstance(documented, list):
        if not isinstance(real, list):
            return [where or "(top)"]
        missing = []
        for i, item in enumerate(documented):
            if i < len(real):
                missing += missing_keys(item, real[i], f"{where}[{i}]")
            elif isinstance(item, (dict, list)):
                missing.append(f"{where}[{i}]")
        return missing
    return []


def _metric_names(text: str) -> set[str]:
    names = set()
    for line in text.splitlines():
        match = re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", line.strip())
        if match and not line.startswith("#"):
            names.add(match.group(0))
    return names


def _value_at(data: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        data = data[int(part)] if isinstance(data, list) else data[part]
    return data


@pytest.fixture
def docs_client(sqlite_url: str, tmp_path: Path) -> Iterator[Any]:
    """The app as `perfmodel serve` runs it, on a fresh SQLite store and a private copy of the shipped models (the
    promotion example writes the registry's promoted.json)."""
    from service.settings import ServiceSettings
    from tests.conftest import copy_shipped_models
    from tests.service.conftest import make_client

    settings = ServiceSettings(store_url=sqlite_url, models_dir=copy_shipped_models(tmp_path / "models"),
                               sync_interval_s=0)
    with make_client(settings) as client:
        yield client


# documented answers that must match what the shipped models answer: the model names exactly, the predicted step and
# throughput (a number, or a matrix's rows of them) within this share (a sample copied from an earlier model drifts
# past it: refresh the samples, `REFRESH_ENV`)
NAMED_KEYS = frozenset({"model_version", "model_versions"})
ANSWER_KEYS = frozenset({"iter_time_ms", "throughput_samples_per_s"})
ANSWER_TOLERANCE = 0.01
REFRESH_ENV = "PERFMODEL_REFRESH_API_DOCS"


def _numbers_off(value: Any, real: Any) -> bool:
    """Whether a documented number (or nested list of numbers) is off the real one by more than the tolerance."""
    if isinstance(value, list) and isinstance(real, list):
        return len(value) != len(real) or any(_numbers_off(v, r) for v, r in zip(value, real))
    if isinstance(value, bool) or isinstance(real, bool):
        return False
    if isinstance(value, (int, float)) and isinstance(real, (int, float)):
        return abs(value - real) > ANSWER_TOLERANCE * abs(real)
    return False


def drifted(documented: Any, real: Any, where: str = "") -> list[str]:
    """Where the documented JSON names other models than the real response, or answers another step or throughput
    by more than `ANSWER_TOLERANCE`."""
    out: list[str] = []
    if isinstance(documented, dict) and isinstance(real, dict):
        for key, value in documented.items():
            if key not in real:
                continue
            here = f"{where}.{key}" if where else key
            if key in NAMED_KEYS and value != real[key]:
                out.append(f"{here}: documented {value!r}, answered {real[key]!r}")
            elif key in ANSWER_KEYS and _numbers_off(value, real[key]):
                out.append(f"{here}: documented {value}, answered {_four_digits(real[key])}")
            else:
                out += drifted(value, real[key], here)
    elif isinstance(documented, list) and isinstance(real, list):
        for i, (item, answered) in enumerate(zip(documented, real)):
            out += drifted(item, answered, f"{where}[{i}]")
    return out


def _four_digits(value: Any) -> Any:
    """A number at four significant digits (whole above 1,000), as the documented answers are written; lists item by
    item."""
    if isinstance(value, list):
        return [_four_digits(v) for v in value]
    if isinstance(value, bool) or not isinstance(value, float) or value == 0 or not math.isfinite(value):
        return value
    return float(round(value)) if abs(value) >= 1000 else round(value, 3 - math.floor(math.log10(abs(value))))


def refreshed(block: str, documented: Any, real: Any) -> str:
    """A documented JSON response (`block`, its text) with every float the real response answers otherwise (at four
    significant digits: `_four_digits`) written in, in place: the layout, the keys and all else stay as written."""
    def walk(doc: Any, answered: Any, key: str | None, text: str) -> str:
        if isinstance(doc, dict) and isinstance(answered, dict):
            for k, v in doc.items():
                if k in answered:
                    text = walk(v, answered[k], k, text)
            return text
        if isinstance(doc, list) and isinstance(answered, list) and not _only_numbers(doc):  # a list of objects
            for d, a in zip(doc, answered):
                text = walk(d, a, None, text)
            return text
        new = _four_digits(answered)
        if key is None or not isinstance(doc, (float, list)) or new == doc or _shape(new) != _shape(doc):
            return text
        written = re.compile(rf'("{re.escape(key)}":\s*){_literal_pattern(doc)}')
        return written.sub(lambda m: m.group(1) + json.dumps(new), text, count=1)

    return walk(documented, real, None, block)


def _only_numbers(value: Any) -> bool:
    if isinstance(value, list):
        return all(_only_numbers(v) for v in value)
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _shape(value: Any) -> Any:
    return [_shape(v) for v in value] if isinstance(value, list) else type(value).__name__


def _literal_pattern(value: Any) -> str:
    """A regex matching `value` as JSON text however its items are spaced."""
    if isinstance(value, list):
        return r"\[\s*" + r"\s*,\s*".join(_literal_pattern(v) for v in value) + r"\s*\]"
    return re.sub(r"\\\.0$", r"(?:\\.0)?", re.escape(json.dumps(value)))


def test_drifted_names_other_models_and_answers_off_by_more_than_the_tolerance():
    documented = {"model_version": "a/v1", "iter_time_ms": 10.0, "rows": [{"throughput_samples_per_s": 100.0}],
                  "matrix": {"iter_time_ms": [[10.0, 20.0]]}}
    real = {"model_version": "a/v2", "iter_time_ms": 10.05, "rows": [{"throughput_samples_per_s": 150.0}],
            "matrix": {"iter_time_ms": [[10.0, 30.0]]}}
    assert drifted(documented, real) == ["model_version: documented 'a/v1', answered 'a/v2'",
                                         "rows[0].throughput_samples_per_s: documented 100.0, answered 150.0",
                                         "matrix.iter_time_ms: documented [[10.0, 20.0]], answered [[10.0, 30.0]]"]
    assert drifted(documented, {**real, "model_version": "a/v1", "rows": documented["rows"],
                                "matrix": documented["matrix"]}) == []


def test_a_refreshed_response_has_the_real_numbers_and_keeps_its_layout_and_everything_else():
    block = (
        '{\n  "iter_time_ms": 47.22,\n  "interval_ms": [31.03, 79.5],\n  "nodes": 2,\n  "fits": true,\n'
        '  "breakdown_ms": {"forward": 17.98, "communication": 6.156},\n'
        '  "rows": [{"throughput_samples_per_s": 5421.0}],\n  "grid": [[155.9, 184.0], [41.06, 46.85]]\n}')
    documented = json.loads(block)
    real = {"iter_time_ms": 46.93085, "interval_ms": [31.3102, 74.544], "nodes": 3, "fits": False,
            "breakdown_ms": {"forward": 17.98, "communication": 5.86612, "optimizer": 1.0},
            "rows": [{"throughput_samples_per_s": 5454.83}], "grid": [[176.31, 205.84], [41.06, 46.5612]]}
    out = refreshed(block, documented, real)
    assert json.loads(out) == {"iter_time_ms": 46.93, "interval_ms": [31.31, 74.54], "nodes": 2, "fits": True,
                               "breakdown_ms": {"forward": 17.98, "communication": 5.866},
                               "rows": [{"throughput_samples_per_s": 5455.0}],
                               "grid": [[176.3, 205.8], [41.06, 46.56]]}
    assert out.count("\n") == block.count("\n") and '"breakdown_ms": {"forward": 17.98, "communication"' in out


@pytest.mark.slow  # two graph captures (resnet50, BERT-base) and ~30 requests: ~20 s here
def test_every_api_example_runs_against_the_app(docs_client):
    text = API_DOC.read_text()
    examples = parse_examples(text)
    assert len(examples) >= 20
    refresh = os.environ.get(REFRESH_ENV) == "1"
    kept: dict[str, Any] = {}
    for example in examples:
        path = _substitute_path(example.path, kept)
        kwargs: dict[str, Any] = {}
        if example.body is not None:
            if example.body_lang == "json":
                kwargs["json"] = _substitute(json.loads(example.body), kept)
            elif example.body_lang == "yaml":
                kwargs["content"] = example.body.encode()
                kwargs["headers"] = {"content-type": "application/yaml"}
            else:
                pytest.fail(f"{example}: a request body is a `json` or `yaml` block, not {example.body_lang!r}")
        response = docs_client.request(example.method, path, **kwargs)
        assert 200 <= response.status_code < 300, f"{example}: {response.status_code} {response.text[:2000]}"
        assert response.status_code == example.status, f"{example}: {response.status_code}, documented " \
                                                        f"{example.status}"
        if example.response is not None:
            if example.response_lang == "json":
                documented = json.loads(example.response)
                missing = missing_keys(documented, response.json())
                assert not missing, f"{example}: documented keys missing from the real response: {missing}"
                off = drifted(documented, response.json())
                if off and refresh:
                    block = refreshed(example.response, documented, response.json())
                    text = text.replace(example.response, block)
                    off = drifted(json.loads(block), response.json())
                assert not off, f"{example}: documented answers the shipped models do not give: {off} " \
                                f"(refresh them: {REFRESH_ENV}=1)"
            elif example.response_lang == "text":
                absent = _metric_names(example.response) - _metric_names(response.text)
                assert not absent, f"{example}: documented metrics the app does not export: {sorted(absent)}"
            else:
                pytest.fail(f"{example}: a response is a `json` or `text` block, not {example.response_lang!r}")
        for name, dotted in example.keep.items():
            kept[name] = _value_at(response.json(), dotted)
    if refresh:
        API_DOC.write_text(text)


def _app_routes() -> set[tuple[str, str]]:
    """(method, path template) of every route of the app: the API's (OpenAPI) and the docs' own."""
    from fastapi.routing import APIRoute
    from starlette.routing import Mount, Route

    from service.app import create_app
    from service.settings import ServiceSettings

    app = create_app(ServiceSettings())
    # OpenAPI drops path convertors (`{version:path}` is `{version}` there): take them from the routers' routes
    convertors: dict[str, str] = {}
    for route in app.routes:
        for inner in getattr(getattr(route, "original_router", None), "routes", ()):
            if isinstance(inner, APIRoute):
                convertors[re.sub(r":[a-z]+\}", "}", inner.path)] = inner.path
    routes = {(method.upper(), convertors.get(path, path)) for path, operations in app.openapi()["paths"].items()
              for method in operations}
    for route in app.routes:
        if isinstance(route, (APIRoute, Route)):
            routes |= {(method, route.path) for method in route.methods or () if method != "HEAD"}
        elif isinstance(route, Mount):
            routes.add(("GET", route.path + "/{path:path}"))
    return routes


def _template_regex(template: str) -> re.Pattern[str]:
    """A path template as a regex: `{name}` one path segment, `{name:path}` any."""
    parts = re.split(r"(\{[^}]+\})", template)
    return re.compile("".join((".+" if part.endswith(":path}") else "[^/]+") if part.startswith("{")
                              else re.escape(part) for part in parts))


def test_every_route_of_the_app_has_an_example():
    examples = parse_examples(API_DOC.read_text())
    undocumented = sorted(f"{method} {template}" for method, template in _app_routes()
                          if not any(e.method == method and _template_regex(template).fullmatch(e.path)
                                     for e in examples))
    assert not undocumented, f"routes with no example in docs/api.md: {undocumented}"


def _documents() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def _without_fences(text: str) -> str:
    return re.sub(r"^```.*?^```\s*$", "", text, flags=re.MULTILINE | re.DOTALL)


def _prose(text: str) -> str:
    """The text without fenced blocks and inline code (links there are not links)."""
    return re.sub(r"`[^`\n]*`", "", _without_fences(text))


def slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    anchors = set()
    for line in _without_fences(path.read_text()).splitlines():
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if match:
            base = slug(match.group(1))
            count = seen.get(base, 0)
            seen[base] = count + 1
            anchors.add(base if count == 0 else f"{base}-{count}")
    return anchors


def test_relative_links_point_to_existing_files():
    broken = []
    for document in _documents():
        for target in re.findall(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", _prose(document.read_text())):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            file_part, _, anchor = target.partition("#")
            linked = (document.parent / file_part).resolve() if file_part else document
            if not linked.exists():
                broken.append(f"{document.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
                broken.append(f"{document.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_no_issue_numbers_in_the_docs():
    found = [f"{document.relative_to(ROOT)}:{n}: {line.strip()}" for document in _documents()
             for n, line in enumerate(document.read_text().splitlines(), 1) if ISSUE_REFERENCE.search(line)]
    assert not found, "\n".join(found)


def test_the_readme_is_a_short_guide_with_the_two_quickstart_commands():
    lines = README.read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines (at most {README_MAX_LINES})"
    assert "make run    # set up .venv (CPU torch where there is no GPU), then serve on http://127.0.0.1:8000 " \
           "(docs: /docs)" in lines
    assert "make test   # set up .venv, then run the whole test suite (this is what .ci/run does)" in lines
    assert all((DOCS / name).is_file() for name in ("api.md", "accuracy.md", "placement.md", "hardware.md",
                                                    "calibration.md", "operations.md", "development.md"))


def test_the_whole_step_weights_docs_quote_are_the_promoted_stages():
    """docs/predictors.md quotes the served whole-step stage's convolution math and AMP weights: a promotion that
    moves them must move the text (a copy from an earlier stage reads as the served one's)."""
    promoted = json.loads((ROOT / "models" / "promoted.json").read_text())["whole-step"]
    stage = json.loads((ROOT / "models" / promoted / "stage.json").read_text())
    names = json.loads((ROOT / "models" / promoted / "manifest.json").read_text())["feature_names"]
    weights = dict(zip(names, stage["params"]["weights"]))
    extra = stage["extra"]

    def signed(value: float, digits: int = 2) -> str:
        return f"{'+' if value >= 0 else '−'}{abs(value):.{digits}f}"

    text = (DOCS / "predictors.md").read_text()
    quoted = [f"TF32 math: {signed(weights['share_conv_tf32'])} in log per unit share",
              f"fewer multiplies: {signed(weights['share_conv_winograd'])};",
              f"{signed(extra['amp'], 3)} in log for an AMP step",
              *([f"{signed(extra['share_conv_amp'])} x `share_conv_amp`"] if "share_conv_amp" in extra else [])]
    missing = [phrase for phrase in quoted if " ".join(phrase.split()) not in " ".join(text.split())]
    assert not missing, f"docs/predictors.md does not quote the promoted stage ({promoted}): {missing}"


def test_the_registry_readme_lists_every_shipped_model_and_marks_the_promoted_ones():
    """models/README.md has a row for every `models/<name>/<version>/`, and the rows marked promoted are exactly the
    models `promoted.json` names."""
    models = ROOT / "models"
    text = (models / "README.md").read_text()
    rows = {m.group(1): m.group(2).strip() for m in re.finditer(r"^\| `([^`]+/v\d+)` \|.*\| ([^|]+) \|$", text, re.M)}
    shipped = {f"{d.parent.name}/{d.name}" for d in models.glob("*/v*") if (d / "manifest.json").is_file()}
    assert shipped <= set(rows), f"models/README.md has no row for {sorted(shipped - set(rows))}"
    promoted = set(json.loads((models / "promoted.json").read_text()).values())
    assert {name for name, status in rows.items() if status == "promoted"} == promoted
