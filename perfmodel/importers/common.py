"""What the importers share: the dataset-root check, device resolution through the hardware catalog, tolerant
number parsing, and the counts an import reports (records per file and op class, rows skipped and why)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from perfmodel.core.errors import PerfmodelError, UnknownNameError
from perfmodel.hardware.catalog import get_accelerator, load_catalog
from perfmodel.hardware.spec import HardwareSpec
from perfmodel.profilers.external import OpClass, OpMeasurement

if TYPE_CHECKING:
    import pandas as pd


@dataclass
class ImportStats:
    """What one import read: filled in while its records are iterated."""

    files: list[str] = field(default_factory=list)  # data files read, relative to the dataset root
    records: Counter[tuple[str, str]] = field(default_factory=Counter)  # (source_file, op_class) -> records
    by_device: Counter[tuple[str, str]] = field(default_factory=Counter)  # (device id, op_class) -> records
    unknown_devices: Counter[str] = field(default_factory=Counter)  # device as the data names it -> rows skipped
    skipped: Counter[str] = field(default_factory=Counter)  # reason -> rows (or files) skipped

    @property
    def total(self) -> int:
        return sum(self.records.values())

    def count(self, record: OpMeasurement) -> OpMeasurement:
        self.records[(record.source_file, record.op_class)] += 1
        self.by_device[(record.device, record.op_class)] += 1
        return record


@dataclass(frozen=True)
class Mapped:
    """What one upstream row becomes: the op class, NeuSight-style op name, shape fields and facts for `extra`."""

    op_class: OpClass
    op_name: str
    shape: dict[str, int]
    detail: dict[str, Any]


class DeviceResolver:
    """Device names as a dataset writes them -> catalog ids, or None for a device the catalog lacks. Each name is
    looked up once; the catalog files are read once per import."""

    def __init__(self, catalog: Mapping[str, HardwareSpec] | None = None) -> None:
        self.catalog = load_catalog() if catalog is None else catalog
        self._known: dict[tuple[str, ...], str | None] = {}

    def __call__(self, *names: str) -> str | None:
        """The catalog id of the first of `names` (a name or alias) the catalog knows."""
        if names not in self._known:
            self._known[names] = None
            for name in names:
                try:
                    self._known[names] = get_accelerator(name, self.catalog).name
                    break
                except UnknownNameError:
                    continue
        return self._known[names]


def check_root(root: Path | str, source: str, markers: Sequence[str], hint: str) -> Path:
    """`root` as a Path, if it is a folder holding at least one of `markers` (relative paths); else a user error."""
    root = Path(root).expanduser()
    if not root.exists():
        raise PerfmodelError(f"no {source} dataset at {root}: no such folder")
    if not root.is_dir():
        raise PerfmodelError(f"no {source} dataset at {root}: not a folder")
    if not any((root / marker).exists() for marker in markers):
        raise PerfmodelError(f"{root} does not look like the {source} dataset: {hint}")
    return root


def data_files(root: Path, patterns: Iterable[str]) -> list[Path]:
    """The .csv and .csv.gz files matching the glob `patterns` under `root`, sorted, each once."""
    found: set[Path] = set()
    for pattern in patterns:
        for suffix in (".csv", ".csv.gz"):
            found.update(p for p in root.glob(pattern + suffix) if p.is_file())
    return sorted(found)


def select_files(root: Path, all_files: list[Path], only: Iterable[str] | None) -> list[Path]:
    """`all_files`, or just those named in `only` (paths relative to `root`); a name that is not a data file of
    this dataset is a user error."""
    if only is None:
        return all_files
    by_name = {relative(root, p): p for p in all_files}
    chosen = []
    for name in only:
        name = Path(name).as_posix()
        if name not in by_name:
            raise PerfmodelError(f"{name} is not one of the dataset's data files under {root}")
        chosen.append(by_name[name])
    return chosen


def relative(root: Path, path: Path) -> str:
    return path.relative_to(root).as_posix()


def read_csv(path: Path) -> pd.DataFrame:
    """A CSV (or gzip of one) as it is: every column as pandas guesses it, nothing renamed."""
    import pandas as pd

    try:
        return pd.read_csv(path, low_memory=False)
    except (OSError, ValueError) as exc:  # pandas' parser errors are ValueErrors
        raise PerfmodelError(f"cannot read {path}: {exc}") from None


def number(value: Any) -> float | None:
    """A finite number from a cell (numbers, numeric strings), None for blanks, NaN and text like 'N/A*'."""
    if value is None or isinstance(value, bool):
        return None
    try:
        result = float(value)
    except (TypeError, ValueError):
        return None
    return result if math.isfinite(result) else None


def integer(value: Any) -> int | None:
    """An integer cell (3, 3.0, '3'); None for blanks and text. A non-integral number is None too."""
    result = number(value)
    if result is None or result != int(result):
        return None
    return int(result)


def first(row: Mapping[str, Any], *columns: str, parse: Callable[[Any], Any] = integer) -> Any:
    """The first of `columns` that the row has a value in (column names vary between sheets)."""
    for column in columns:
        value = parse(row.get(column))
        if value is not None:
            return value
    return None


def plain(value: Any) -> Any:
    """A cell as a JSON-ready Python value (numpy scalars unwrapped, NaN as None)."""
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def compact(extra: Mapping[str, Any]) -> dict[str, Any]:
    """`extra` without its empty entries, every value plain."""
    result = {}
    for key, value in extra.items():
        value = plain(value)
        if value is None or value == "" or value == []:
            continue
        result[key] = value
    return result


def rows(frame: pd.DataFrame) -> Iterator[tuple[int, dict[str, Any]]]:
    """(0-based data row of the file, {column: value}) for each row of a frame read by `read_csv` (or a filtered
    view of one: the row numbers stay those of the file)."""
    for index, row in zip(frame.index, frame.to_dict("records")):
        # pandas-stubs type a record's keys Hashable: read_csv's column names are str
        yield int(index), cast("dict[str, Any]", row)


RecordsFn = Callable[[Path, list[Path], "ImportStats", "DeviceResolver"], Iterator[OpMeasurement]]


@dataclass(frozen=True)
class DatasetImporter:
    """One dataset's importer: where its files are and how to read them (`records`). Calling it checks the folder
    now and yields the records lazily; `files` limits the import to some data files (relative paths, see
    `files_in`)."""

    source: str
    markers: tuple[str, ...]  # folders a dataset of this kind has (checked before anything is read)
    file_patterns: tuple[str, ...]
    layout_hint: str  # said when the folder does not look like the dataset
    records: RecordsFn

    def files_in(self, root: Path) -> list[str]:
        """The data files the importer reads, relative to the dataset root."""
        return [relative(root, p) for p in data_files(root, self.file_patterns)]

    def __call__(self, root: Path | str, *, stats: ImportStats | None = None,
                 catalog: Mapping[str, HardwareSpec] | None = None,
                 files: Iterable[str] | None = None) -> Iterator[OpMeasurement]:
        root = check_root(root, self.source, self.markers, self.layout_hint)
        chosen = select_files(root, data_files(root, self.file_patterns), files)
        return self.records(root, chosen, stats if stats is not None else ImportStats(), DeviceResolver(catalog))

