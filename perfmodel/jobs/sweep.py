"""Sweep files: many jobs in one YAML or JSON file, expanded as cross products.

    jobs:
      - zoo: [resnet18, resnet50]
        batch_size: [8, 16, 32]
        mode: train
      - hf_config: configs/gpt2.json
        batch_size: 4
        seq_len: [128, 256]

Every list-valued field of an entry is expanded; the others are shared. Fields are those of `JobSpec.from_options`:
zoo, hf_config, task, module, onnx, batch_size, seq_len, precision, optimizer, mode; an entry names exactly one model
source (zoo, hf_config, module or onnx). Paths are relative to the sweep file. `jobs` is the only top-level key: the
device and the profiling options are the command's (`perfmodel profile --sweep FILE --device cuda`), so a sweep
that names any other (`device: cuda`) is refused rather than run somewhere it did not ask for.

`load_sweep` checks every job before any runs: a bad value, an unknown field (in an entry or at the top level), an
empty `jobs` list and a model source
that does not resolve (`check_source`: an unknown zoo name, a missing or unparsable module file or NAME, a missing
or unreadable ONNX file) are errors naming the entry (`jobs[i]`). Nothing is built, captured or run to check.
"""

from __future__ import annotations

import ast
import itertools
import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from perfmodel.core.errors import JobLoadError, PerfmodelError, validation_message
from perfmodel.jobs.spec import JobSpec, ModuleSource, OnnxSource, ZooSource

SWEEP_FIELDS = ("zoo", "hf_config", "task", "module", "onnx", "batch_size", "seq_len", "precision", "optimizer",
                "mode")
SOURCE_FIELDS = ("zoo", "hf_config", "module", "onnx")
_PATH_FIELDS = ("hf_config", "module", "onnx")


def load_sweep(path: str | Path) -> list[JobSpec]:
    """The jobs of a sweep file, in file order. Every job is checked first, its model source resolved
    (`check_source`): a PerfmodelError naming the file and the entry (`jobs[i]`) otherwise; a top-level key other
    than `jobs` is one too (the device and the other run options are the command's, never the file's)."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise PerfmodelError(f"cannot read sweep file {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise PerfmodelError(f"sweep file {path} is not text (YAML or JSON)") from None
    data = _parse(text, path)
    if not isinstance(data, dict) or not isinstance(data.get("jobs"), list):
        raise PerfmodelError(f"sweep file {path} needs a top-level 'jobs' list")
    if not data["jobs"]:
        raise PerfmodelError(f"sweep file {path} holds no job: its 'jobs' list is empty")
    others = sorted(map(str, set(data) - {"jobs"}))
    if others:
        raise PerfmodelError(f"sweep file {path} has top-level fields {others} that nothing reads: a sweep holds only "
                             "'jobs'; the device and the profiling options are the command's (perfmodel profile "
                             "--sweep FILE --device cuda ...)")
    specs: list[JobSpec] = []
    checked: set[tuple[str, str]] = set()  # sources already resolved, by (kind, name or path)
    for i, entry in enumerate(data["jobs"]):
        where = f"sweep file {path}: jobs[{i}]"
        if not isinstance(entry, dict):
            raise PerfmodelError(f"{where} is not a mapping")
        unknown = set(entry) - set(SWEEP_FIELDS)
        if unknown:
            raise PerfmodelError(f"{where} has unknown fields {sorted(map(str, unknown))}; the fields are "
                                 f"{', '.join(SWEEP_FIELDS)}")
        for spec in _expand(entry, where, path):
            ident = _source_ident(spec)
            if ident is not None and ident not in checked:
                try:
                    check_source(spec)
                except PerfmodelError as exc:
                    raise PerfmodelError(f"{where}: {exc}") from None
                checked.add(ident)
            specs.append(spec)
    return specs


def _parse(text: str, path: Path) -> Any:
    if path.suffix == ".json":
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise PerfmodelError(f"sweep file {path} is not valid JSON: {exc}") from None
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = exc.problem or "cannot parse"
        context = ""
        if exc.context:
            start = exc.context_mark
            began = ""
            if start is not None and (mark is None or (start.line, start.column) != (mark.line, mark.column)):
                began = f" that starts at line {start.line + 1}, column {start.column + 1}"
            context = f" ({exc.context}{began})"
        raise PerfmodelError(f"sweep file {path} is not valid YAML{at}: {problem}{context}") from None
    except yaml.YAMLError as exc:
        raise PerfmodelError(f"sweep file {path} is not valid YAML: {str(exc).splitlines()[0]}") from None


def _expand(entry: dict[str, Any], where: str, path: Path) -> list[JobSpec]:
    sources = [field for field in SOURCE_FIELDS if entry.get(field) is not None]
    if len(sources) != 1:
        got = f"it gives {' and '.join(sources)}" if sources else "it gives none"
        raise PerfmodelError(f"{where}: give exactly one model source, one of the keys zoo, hf_config, module or "
                             f"onnx; {got}")
    keys = list(entry)
    values = [v if isinstance(v, list) else [v] for v in entry.values()]
    for key, value in zip(keys, values):
        if not value:
            raise PerfmodelError(f"{where}: {key} is an empty list, so the entry holds no job")
        if key in _PATH_FIELDS and not all(isinstance(v, str) for v in value):
            raise PerfmodelError(f"{where}: {key} must be a path (a string), got {value[0]!r}")
    specs = []
    for combo in itertools.product(*values):
        options = dict(zip(keys, combo))
        # file paths in a sweep are relative to the sweep file
        if isinstance(options.get("hf_config"), str):
            options["hf_config"] = path.parent / options["hf_config"]
        if isinstance(options.get("onnx"), str):
            options["onnx"] = str(path.parent / options["onnx"])
        if isinstance(options.get("module"), str) and ":" in options["module"]:
            file, _, name = options["module"].rpartition(":")
            options["module"] = f"{path.parent / file}:{name}"
        try:
            specs.append(JobSpec.from_options(**options))
        except ValidationError as exc:
            raise PerfmodelError(f"{where}: {validation_message(exc)}") from None
        except PerfmodelError as exc:  # e.g. an HF config that is missing or not JSON
            raise PerfmodelError(f"{where}: {exc}") from None
    return specs


def _source_ident(spec: JobSpec) -> tuple[str, str] | None:
    source = spec.source
    if isinstance(source, ZooSource):
        return "zoo", source.name
    if isinstance(source, (ModuleSource, OnnxSource)):
        return source.kind, source.path
    return None  # an HF config or a graph IR: read and checked when the spec was made


def check_source(spec: JobSpec) -> None:
    """Raise a PerfmodelError when `spec`'s model source does not resolve: an unknown zoo name, a module file that
    is missing, does not parse or defines no NAME (`path:NAME`), an ONNX file that is missing or not an ONNX model.
    Cheap: nothing is built, captured or run (a module file is parsed, not imported; an ONNX file is read without
    its external weights). HF configs and graph IRs were read and checked when the spec was made."""
    source = spec.source
    if isinstance(source, ZooSource):
        from perfmodel.jobs.zoo import get_entry

        get_entry(source.name)
    elif isinstance(source, ModuleSource):
        _check_module(source.path)
    elif isinstance(source, OnnxSource):
        _check_onnx(Path(source.path))


def _check_module(path: str) -> None:
    file, _, name = path.rpartition(":")
    file_path = Path(file)
    if not file_path.is_file():
        raise JobLoadError(f"module file not found: {file_path}")
    try:
        tree = ast.parse(file_path.read_bytes(), filename=str(file_path))
    except OSError as exc:
        raise JobLoadError(f"cannot read module file {file_path}: {exc.strerror}") from None
    except (SyntaxError, ValueError) as exc:
        line = f" (line {exc.lineno})" if isinstance(exc, SyntaxError) and exc.lineno else ""
        raise JobLoadError(f"could not load {path}: {type(exc).__name__}: {getattr(exc, 'msg', exc)}{line}") from None
    names = _identifiers(tree)
    if name in names or names & _DYNAMIC_BINDERS:  # a dynamic binder may bind NAME where no line spells it
        return
    defined = [stmt.name for stmt in tree.body
               if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    raise JobLoadError(f"{file_path} defines no {name!r}; the functions and classes it defines: "
                       f"{', '.join(defined) if defined else 'none'}")


def _identifiers(tree: ast.Module) -> set[str]:
    """Every name the module spells anywhere: assigned, defined, imported or used. A name it never spells is a typo;
    one it spells is left for loading to confirm (the check stays a parse, never an import)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.alias):
            names.add(node.asname or node.name.partition(".")[0])
    return names


# what can bind a module attribute without spelling its name: a star import, a module `__getattr__`, exec
_DYNAMIC_BINDERS = frozenset({"*", "__getattr__", "exec", "globals", "locals", "vars"})


def _check_onnx(path: Path) -> None:
    if not path.is_file():
        raise JobLoadError(f"ONNX file not found: {path}")
    import onnx

    try:
        # Weights stored outside the file are not needed to know it is a model.
        model = onnx.load(str(path), load_external_data=False)
    except OSError as exc:
        raise JobLoadError(f"cannot read ONNX file {path}: {exc.strerror}") from None
    except Exception as exc:  # protobuf DecodeError and friends: never show their traceback
        first = str(exc).strip().splitlines()
        raise JobLoadError(f"{path} is not a readable ONNX model ({type(exc).__name__}"
                           f"{': ' + first[0] if first else ''})") from None
    if not model.graph.node:
        raise JobLoadError(f"{path} is not an ONNX model (it holds no graph nodes)")
