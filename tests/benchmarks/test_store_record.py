"""The store's own record of its matrix (what was stated before the first cell, the sessions): kept with the cells,
read back as written, and an edit of it told apart from the record the store wrote."""

import json

import pyarrow.parquet as pq
import pytest

from benchmarks.errors import UsageError
from benchmarks.store import STORE_FILE, ResultStore

RECORD = {"analysis": {"primary": "final", "margin": 0.05, "stated_at": "2026-12-07T10:00:00+00:00"},
          "sessions": [{"cells_run": 1, "elapsed_s": 36.0}]}


def test_the_record_is_read_back_as_written_and_kept_through_later_writes(tmp_path):
    store = ResultStore.open(tmp_path)
    store.record = json.loads(json.dumps(RECORD))
    store.put("pizza/grpo/seed0", {"task": "pizza"}, {"status": "complete"}, [{"step": 1, "loss": 0.5}])
    again = ResultStore.open(tmp_path)
    assert again.record == RECORD and again.finished() == ["pizza/grpo/seed0"]
    again.put("pizza/grpo/seed1", {"task": "pizza"}, {"status": "failed"}, [])
    assert ResultStore.open(tmp_path).record == RECORD  # a cell added later keeps the record


def test_an_edited_record_is_refused(tmp_path):
    store = ResultStore.open(tmp_path)
    store.record = json.loads(json.dumps(RECORD))
    store.put("pizza/grpo/seed0", {"task": "pizza"}, {"status": "complete"}, [])
    table = pq.read_table(tmp_path / STORE_FILE)
    meta = json.loads(table.schema.metadata[b"grpo_bench"])
    meta["record"]["analysis"]["margin"] = 0.2  # moved after seeing the marks, the digest left as it was
    pq.write_table(table.replace_schema_metadata({"grpo_bench": json.dumps(meta)}), tmp_path / STORE_FILE)
    with pytest.raises(UsageError, match="matrix record does not match"):
        ResultStore.open(tmp_path)
