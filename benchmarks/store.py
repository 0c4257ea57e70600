"""The result store: one Parquet file (zstd) per matrix, ``DIR/results.parquet``, holding every finished
cell's spec, summary and per-step metrics rows. It is what a matrix keeps and commits and the only thing
the report reads; a cell's own folder is working space (config, checkpoints, log) that is not kept.

One table, two kinds of row, keyed by ``cell`` (the cell's folder relative to DIR):
    kind = "cell"   ``spec`` and ``summary`` as JSON text (the cell's full resolved spec and its summary.json)
    kind = "step"   ``step`` and one column per metric of that step's metrics.jsonl row

A missing metric is null and a NaN metric stays NaN, so a row reads back exactly as it was written
(numbers as float64, ``step`` as int64). The file is rewritten whole through a temporary file and a
rename each time a cell is added, so a kill leaves the previous store or the new one, never a torn file;
a matrix that grows 10x would want append-only parts, which this layout can add without changing readers.

The file's metadata also carries the matrix's ``record``: what was stated before its first cell ran (the
analysis, when) and its sessions, kept beside the cells so that a lost or rewritten matrix.json can be told
from the store alone.

A flipped bit must not read back as another number: every page carries its CRC (Parquet's page checksums)
and the format tag carries a sha256 of the values (``_digest``), which also covers the page headers and the
footer (column names, types). A store written before either is read unverified.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Callable, Iterable, Optional

from benchmarks.errors import UsageError
from benchmarks.io import atomic_write

STORE_FILE = "results.parquet"
FORMAT = {"format": "grpo-bench result store", "version": 1}
_KEYS = ("cell", "kind", "spec", "summary", "step")


def store_path(out: Path | str) -> Path:
    return Path(out) / STORE_FILE


def _pyarrow():
    import pyarrow as pa
    import pyarrow.parquet as pq

    return pa, pq


# How often a cell saves a checkpoint changes what survives a kill, not what the cell computes (a resumed run
# reproduces the uninterrupted one): a matrix may start checkpointing without invalidating its finished cells.
NOT_THE_EXPERIMENT = ("checkpoint_every",)
# Settings added after cells were stored, at the value every earlier cell ran with: a stored spec without one is
# the same experiment as a planned spec that has it at this value. handle_zero_tail: optimal_token_baseline's
# option (algorithms/estimators.py), always on before it was a setting; count_pair_samples: DPO's pairs were built
# outside the budget before it was a setting (verdicts-tuned-v2's DPO tuning cells ran so); minibatch_rows: PPO's
# minibatches were random rows before it was a setting.
ADDED_DEFAULTS = {"replicate": 0, "eval_share_prefix": False, "logits_precision": "same", "handle_zero_tail": True,
                  "count_pair_samples": False, "minibatch_rows": "random"}


def experiment(spec: dict) -> dict:
    """A cell's spec without what does not change its result (``NOT_THE_EXPERIMENT``): two cells with equal
    ``experiment(spec)`` compute the same thing."""
    spec = {k: v for k, v in spec.items() if k not in NOT_THE_EXPERIMENT}
    if "settings" in spec:
        spec["settings"] = {k: v for k, v in spec["settings"].items() if k not in NOT_THE_EXPERIMENT
                            and not (k in ADDED_DEFAULTS and v == ADDED_DEFAULTS[k])}
    return spec


def same_experiment_spec(stored: Optional[dict], planned: dict) -> bool:
    """``stored`` (None: nothing stored) is the spec ``planned``, what does not change a result aside."""
    return stored is not None and experiment(stored) == experiment(planned)


class ResultStore:
    """The cells of one matrix directory, in memory, written back whole on every change."""

    def __init__(self, path: Path, cells: dict[str, dict], steps: dict[str, list[dict]],
                 record: Optional[dict] = None):
        self.path = path
        self.cells = cells  # relpath -> {"spec": dict, "summary": dict}
        self.steps = steps  # relpath -> metrics rows, in step order
        self.record = record if record is not None else {}  # the matrix's own record (module docstring)
        self._tables: dict = {}  # relpath -> its rows as a pyarrow Table, built on the first write

    # -- reading -----------------------------------------------------------------------------------

    @classmethod
    def open(cls, out: Path | str) -> "ResultStore":
        """The store of DIR (empty when there is none yet); a corrupt or foreign file is one UsageError line."""
        path = store_path(out)
        if not path.exists():
            return cls(path, {}, {})
        return cls(path, *_read(path))

    def finished(self) -> list[str]:
        """The cells the store holds as complete."""
        return [k for k, v in self.cells.items() if v["summary"].get("status") == "complete"]

    @classmethod
    def read(cls, out: Path | str) -> Optional["ResultStore"]:
        """The store of DIR, or None when DIR has none."""
        return cls.open(out) if store_path(out).exists() else None

    def summary(self, relpath: str) -> Optional[dict]:
        entry = self.cells.get(relpath)
        return entry["summary"] if entry else None

    def spec(self, relpath: str) -> Optional[dict]:
        entry = self.cells.get(relpath)
        return entry["spec"] if entry else None

    def holds(self, planned: dict) -> bool:
        """Whether the store's cell at ``planned["dir"]`` (a matrix.json cells entry) is that planned experiment."""
        return same_experiment_spec(self.spec(planned["dir"]), {k: v for k, v in planned.items() if k != "dir"})

    def metrics(self, relpath: str) -> list[dict]:
        return self.steps.get(relpath, [])

    # -- writing -----------------------------------------------------------------------------------

    def put(self, relpath: str, spec: dict, summary: dict, metrics: Iterable[dict]) -> None:
        """Add (or replace) one cell and write the store."""
        self.cells[relpath] = {"spec": spec, "summary": summary}
        self.steps[relpath] = list(metrics)
        self._tables.pop(relpath, None)
        self.write()

    def drop(self, relpaths: Iterable[str]) -> None:
        """Remove these cells and write the store."""
        relpaths = [k for k in relpaths if k in self.cells]
        for key in relpaths:
            del self.cells[key]
            self.steps.pop(key, None)
            self._tables.pop(key, None)
        if relpaths:
            self.write()

    def keep_only(self, same: Callable[[str, dict], bool]) -> None:
        """Drop every cell for which ``same(relpath, spec)`` is False (a changed matrix never reuses a stale cell)."""
        stale = [k for k, v in self.cells.items() if not same(k, v["spec"])]
        for key in stale:
            del self.cells[key]
            self.steps.pop(key, None)
            self._tables.pop(key, None)
        if stale:
            self.write()

    def write(self) -> None:
        pa, pq = _pyarrow()
        # One small table per cell, built once: rewriting the store after each cell then costs a concat and
        # the compression, not a conversion of every row again.
        for relpath in self.cells.keys() - self._tables.keys():
            self._tables[relpath] = _cell_table(relpath, self.cells[relpath], self.steps.get(relpath, []))
        tables = [self._tables[k] for k in self.cells]
        table = (pa.concat_tables(tables, promote_options="permissive") if tables
                 else pa.table({k: pa.array([], pa.string()) for k in ("cell", "kind", "spec", "summary")}))
        meta = {**FORMAT, "sha256": _digest(table)}
        if self.record:
            meta.update(record=self.record, record_sha256=_record_digest(self.record))
        table = table.replace_schema_metadata({"grpo_bench": json.dumps(meta, default=str)})
        atomic_write(self.path, lambda tmp: pq.write_table(table, tmp, **write_options(table)))


def write_options(table) -> dict:
    """How a store's table is written: zstd with page checksums; the float columns (the metrics) split by byte
    stream, so that their sign-and-exponent bytes, which vary little, compress apart from the mantissas (the
    committed stores 30% smaller, as fast), and dictionary encoding kept for the rest (cell names, specs)."""
    pa, _ = _pyarrow()
    floats = [f.name for f in table.schema if pa.types.is_floating(f.type)]
    return {"compression": "zstd", "write_page_checksum": True, "use_byte_stream_split": floats or False,
            "use_dictionary": [name for name in table.column_names if name not in floats]}


def _cell_table(relpath: str, entry: dict, metrics: list[dict]):
    pa, _ = _pyarrow()
    rows = [{"cell": relpath, "kind": "cell", "spec": json.dumps(entry["spec"], sort_keys=True, default=str),
             "summary": json.dumps(entry["summary"], sort_keys=True, default=str)}]
    rows += [{"cell": relpath, "kind": "step", **_numbers(r)} for r in metrics]
    names = sorted({k for r in rows for k in r} - set(_KEYS))
    fields = [("cell", pa.string()), ("kind", pa.string()), ("spec", pa.string()), ("summary", pa.string()), ("step", pa.int64())]
    for name in names:
        kinds = {type(r[name]) for r in rows if r.get(name) is not None}
        fields.append((name, pa.float64() if kinds <= {float} else pa.string()))
    string_columns = {n for n, t in fields if t == pa.string()}
    return pa.Table.from_pylist(
        [{k: (json.dumps(v) if k in string_columns and v is not None and not isinstance(v, str) else v) for k, v in r.items()}
         for r in rows], schema=pa.schema(fields))


def _numbers(row: dict) -> dict:
    """A metrics row with every number as float (``step`` stays an int): one column type per metric."""
    return {k: (v if k == "step" else float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v)
            for k, v in row.items()}


def _digest(table) -> str:
    """sha256 of a table's values column by column (name, type, nulls, values): equal for the table written and
    the table read back, whatever the chunks, and different after any change a reader would see."""
    import numpy as np
    import pyarrow.compute as pc

    pa, _ = _pyarrow()
    digest = hashlib.sha256(f"{table.num_rows} rows".encode())
    for field, column in zip(table.schema, table.columns):
        array = column.combine_chunks()
        digest.update(f"\0{field.name}\0{field.type}\0".encode())
        digest.update(np.packbits(array.is_null().to_numpy(zero_copy_only=False)).tobytes())
        if pa.types.is_string(field.type):
            if len(array):  # each value's length, then the values end to end
                array = pc.fill_null(array, "")
                offsets = np.frombuffer(array.buffers()[1], np.int32)[array.offset: array.offset + len(array) + 1]
                digest.update(np.diff(offsets).tobytes())
                digest.update(memoryview(array.buffers()[2])[offsets[0]: offsets[-1]])
        elif pa.types.is_integer(field.type) or pa.types.is_floating(field.type):
            digest.update(pc.fill_null(array, 0).to_numpy(zero_copy_only=False).tobytes())
        else:
            digest.update(repr(array.to_pylist()).encode())
    return digest.hexdigest()


def _record_digest(record: dict) -> str:
    return hashlib.sha256(json.dumps(record, sort_keys=True, default=str).encode()).hexdigest()


def _read(path: Path) -> tuple[dict, dict, dict]:
    pa, pq = _pyarrow()
    try:
        table = pq.read_table(path, page_checksum_verification=True)
        columns = table.column_names  # decoded here: a damaged name is a ValueError
        meta = json.loads((table.schema.metadata or {}).get(b"grpo_bench", b"null"))
    except (OSError, ValueError, pa.ArrowException) as exc:
        reason = f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"
        if "checksum" in str(exc).lower():
            raise UsageError(f"the result store {path} is corrupted: a page fails its checksum ({reason})") from None
        raise UsageError(f"{path}: not a readable result store ({reason})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT["format"]:
        raise UsageError(f"{path}: not a grpo-bench result store (a Parquet file without its format tag)")
    if meta.get("version") != FORMAT["version"]:
        raise UsageError(f"{path}: result store version {meta.get('version')}, this grpo-bench reads version {FORMAT['version']}")
    if "sha256" in meta and meta["sha256"] != _digest(table):
        raise UsageError(f"the result store {path} is corrupted: its values do not match the sha256 it was written with")
    record = meta.get("record") or {}
    if not isinstance(record, dict) or ("record_sha256" in meta and meta["record_sha256"] != _record_digest(record)):
        raise UsageError(f"the result store {path} is corrupted: its matrix record does not match its sha256")
    missing = [c for c in ("cell", "kind", "spec", "summary") if c not in columns]
    if missing:
        raise UsageError(f"{path}: a malformed result store: no {' and no '.join(missing)} column")
    cells: dict[str, dict] = {}
    steps: dict[str, list[dict]] = {}
    for row in table.to_pylist():
        relpath, kind = row.pop("cell"), row.pop("kind")
        if not isinstance(relpath, str) or kind not in ("cell", "step"):
            raise UsageError(f"{path}: a malformed result store: a row of cell {relpath!r} of kind {kind!r} "
                             "(a cell's name and the kind 'cell' or 'step' expected)")
        if kind == "cell":
            cells[relpath] = {key: _json_object(path, relpath, key, row[key]) for key in ("spec", "summary")}
        elif not isinstance(row.get("step"), int):
            raise UsageError(f"{path}: a malformed result store: a metrics row of cell {relpath} without its step number")
        else:
            steps.setdefault(relpath, []).append(
                {k: v for k, v in row.items() if v is not None and k not in ("spec", "summary")})
    for relpath, rows in steps.items():
        rows.sort(key=lambda r: r["step"])
    return cells, steps, record


def _json_object(path: Path, relpath: str, key: str, text) -> dict:
    """A cell's ``spec`` or ``summary``, which must be a JSON object."""
    try:
        value = json.loads(text) if isinstance(text, str) else None
    except json.JSONDecodeError as exc:
        raise UsageError(f"{path}: a malformed result store: the {key} of cell {relpath} is not JSON ({exc})") from None
    if not isinstance(value, dict):
        raise UsageError(f"{path}: a malformed result store: the {key} of cell {relpath} is not a JSON object")
    return value


def environment_changes(before: dict, after: dict, groups: Iterable[str] = ("versions", "rounding")) -> list[str]:
    """What differs between two recorded environments (a cell summary's ``config.environment``) in ``groups`` (each
    library's version, the rounding settings: threads, the CPU's vector capability), one "key old -> new" each, by
    key: the settings that can change a cell's numbers, read the same way by a replay and by an agreement."""
    changes = []
    for group in groups:
        a, b = before.get(group) or {}, after.get(group) or {}
        changes += [f"{key} {a.get(key, '-')} -> {b.get(key, '-')}" for key in sorted(set(a) | set(b))
                    if a.get(key) != b.get(key)]
    return changes

