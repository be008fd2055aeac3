"""The staging format without PostgreSQL: names, chains, empty and aborted segments; and the
reader's command line (the operator's command parses, the start-up stays light)."""

from __future__ import annotations

import os
import subprocess
import sys

import pyarrow as pa
import pytest

from lakeslot import cli, workloads
from lakeslot.api.models import PostgresIngestion
from lakeslot.api.naming import TableName
from lakeslot.reader import DEFAULT_SEGMENT_MAX_BYTES, reader
from lakeslot.reader import command as reader_command
from lakeslot.reader.writer import SegmentWriter
from lakeslot.source.slot import SlotHealth
from lakeslot.staging import segments
from lakeslot.staging.segments import SegmentName, SourceIdentity
from lakeslot.staging.store import Staging
from tests.support.operator_env import OfflineDatabase, ingestion_document

SOURCE = SourceIdentity("7300000000000000001", 1)


def test_names_are_zero_padded_hex_lsns_and_nothing_else_parses():
    name = SegmentName(0x1_6B3748, 0x2_00000010)
    assert name.filename == "00000000016B3748-0000000200000010.parquet"
    assert SegmentName.parse(name.filename) == name
    assert str(name) == "0/16B3748-2/10"
    for other in (".tmp-00000000016B3748-1-ab.parquet", "00000000016b3748-0000000200000010.parquet",
                  "16B3748-200000010.parquet", "00000000016B3748-0000000200000010.parquet.tmp"):
        assert SegmentName.parse(other) is None


def test_chain_follows_the_furthest_segment_and_reports_gaps():
    a, b, c = SegmentName(10, 20), SegmentName(20, 30), SegmentName(30, 40)
    zombie = SegmentName(20, 25)  # an overlapping segment of a zombie reader
    assert segments.chain([c, zombie, a, b], 10) == [a, b, c]
    assert segments.chain([a, b, c], 22) == [b, c]
    assert segments.chain([a, b, c], 40) == []
    assert segments.chain([a, SegmentName(18, 33), c], 10) == [a, SegmentName(18, 33), c]
    with pytest.raises(segments.GapError, match="no sealed segment covers 0/14; the next one "
                                                "starts at 0/1E"):
        segments.chain([a, c], 10)


def test_an_empty_segment_records_progress_and_an_aborted_one_leaves_nothing(tmp_path):
    staging = Staging(tmp_path.as_uri())
    assert staging.resume_point() is None
    sealed = SegmentWriter(staging, 100, SOURCE).seal(250)
    assert staging.list() == [sealed] == [SegmentName(100, 250)]
    segment = staging.read(sealed)
    assert segment.table.num_rows == 0 and segment.table.schema == segments.SCHEMA
    assert segment.metadata.source == SOURCE and segment.metadata.relations == ()
    SegmentWriter(staging, 250, SOURCE).abort()  # nothing was written: nothing to remove
    with pytest.raises(ValueError, match="cannot end"):
        SegmentWriter(staging, 300, SOURCE).seal(299)
    assert sorted(p.name for p in tmp_path.iterdir()) == [sealed.filename]
    assert staging.resume_point() == sealed
    # A writer killed mid-segment leaves a hidden temporary file: never listed, and removed by
    # the next reader once it holds the slot.
    leftover, _ = staging.temporary(250)
    with open(leftover, "wb") as f:
        f.write(b"PAR1 half a segment")
    assert staging.list() == [sealed]
    assert staging.remove_temporaries() == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == [sealed.filename]


def _slot(confirmed_flush_lsn: int) -> SlotHealth:
    return SlotHealth("s", "pgoutput", "logical", "db", True, 1, "x", confirmed_flush_lsn, 1,
                      "reserved", None, 0, 0, False, None, False)


def test_resume_is_the_end_of_staging_from_the_same_system_and_timeline(tmp_path):
    staging = Staging(tmp_path.as_uri())
    assert reader.check_resume(staging, _slot(77), SOURCE) == 77  # empty staging: the slot
    SegmentWriter(staging, 77, SOURCE).seal(300)
    assert reader.check_resume(staging, _slot(77), SOURCE) == 300
    with pytest.raises(reader.ReaderError, match="from timeline 1 to 2") as e:
        reader.check_resume(staging, _slot(77), SourceIdentity(SOURCE.system_id, 2))
    assert (e.value.reason, e.value.lsn) == ("TimelineChanged", 300)
    with pytest.raises(reader.ReaderError) as e:
        reader.check_resume(staging, _slot(77), SourceIdentity("42", 1))
    assert e.value.reason == "SystemChanged"
    reader.check_not_ahead(_slot(300), 300)
    with pytest.raises(reader.ReaderError, match="advanced to 0/12D but staging ends at 0/12C"):
        reader.check_not_ahead(_slot(301), 300)


def test_feedback_interval_is_at_most_a_second_and_half_the_sender_timeout():
    assert reader.feedback_interval(60_000) == 1.0
    assert reader.feedback_interval(1_000) == 0.5
    assert reader.feedback_interval(0) == 1.0  # timeout disabled


def test_staging_uris_are_logged_without_credentials():
    assert reader.redact("s3://AKIA:secret@bucket/prefix?secret_key=x&region=eu") == "s3://bucket/prefix"
    assert reader.redact("file:///var/lib/lakeslot/staging") == "file:///var/lib/lakeslot/staging"


def test_the_operators_reader_command_parses_and_carries_the_source_options():
    document = ingestion_document("orders", OfflineDatabase(), [TableName("public", "t")],
                                  warehouse="/tmp/wh", staging="file:///tmp/staging")
    document["spec"]["source"]["options"] = {"connect_timeout": "7", "target_session_attrs": "read-write"}
    command = workloads.reader_command(PostgresIngestion.model_validate(document))
    args = cli.build_parser().parse_args(command[1:])
    assert args.func is reader_command.run
    config = reader_command.config(args)
    assert (config.ingestion, config.slot, config.staging_uri) == (
        args.ingestion, args.slot, "file:///tmp/staging")
    settings = config.settings
    assert settings.extra["connect_timeout"] == "7" and settings.port == 6543
    assert settings.extra["target_session_attrs"] == "read-write"


@pytest.mark.parametrize(("trigger", "reader", "seconds", "size"), [
    (60, {}, 10.0, DEFAULT_SEGMENT_MAX_BYTES),  # the default interval: as before, 10 s
    (1, {}, 0.5, DEFAULT_SEGMENT_MAX_BYTES),  # freshness in seconds: seal twice per pass
    (5, {}, 2.5, DEFAULT_SEGMENT_MAX_BYTES),
    (1, {"segmentMaxSeconds": 3, "segmentMaxBytes": 64 << 20}, 3.0, 64 << 20),
])
def test_the_reader_seals_segments_as_the_apply_trigger_needs(trigger, reader, seconds, size):
    """The reader seals a segment at half the apply job's trigger interval (between 0.5 and
    10 s) unless the spec says otherwise: segments sealed every 10 s kept freshness above 10 s
    whatever triggerIntervalSeconds said."""
    document = ingestion_document("orders", OfflineDatabase(), [TableName("public", "t")],
                                  warehouse="/tmp/wh", staging="file:///tmp/staging")
    document["spec"]["apply"] = {"triggerIntervalSeconds": trigger}
    document["spec"]["reader"] = reader
    ingestion = PostgresIngestion.model_validate(document)
    command = workloads.reader_command(ingestion)
    config = reader_command.config(cli.build_parser().parse_args(command[1:]))
    assert (config.segment_max_seconds, config.segment_max_bytes) == (seconds, size)
    assert ingestion.spec.seal_seconds() == seconds  # the period the apply job's passes follow


def test_the_reader_command_stays_light():
    """Every ``lakeslot`` command builds the reader's parser, and the reader's start-up counts
    (local mode and the Deployment restart it): neither loads pydantic or the API models."""
    code = ("import sys; from lakeslot import cli; from lakeslot.reader import command; "
            "command.config(cli.build_parser().parse_args(sys.argv[1:])); "
            "print(sorted(m for m in sys.modules if m == 'pydantic' or m.startswith('lakeslot.api')))")
    argv = ["reader", "--ingestion", "ns/n", "--slot", "s", "--publication", "p", "--staging",
            "file:///tmp/staging", "--stop-at-lsn", "0/10"]
    result = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True,
                            check=True)
    assert result.stdout.strip() == "[]"


def test_retention_deletes_applied_old_segments_oldest_first_and_stops_at_the_first_to_keep(tmp_path):
    """Retention looks at the segments it deletes and one more (a long retention of small
    segments is a huge listing; stat-ing every one on every pass cost the apply job seconds)."""
    staging = Staging(tmp_path.as_uri())
    names = [SegmentName(10 * i, 10 * (i + 1)) for i in range(1, 7)]  # 10-20, 20-30, ... 60-70
    now = 1_800_000_000
    ages = [500, 400, 300, 50, 400, 400]  # seconds: the fourth is young, the fifth old again
    for name, age in zip(names, ages, strict=True):
        path = tmp_path / name.filename
        path.write_bytes(b"")
        os.utime(path, (now - age, now - age))
    listing = staging.list()
    assert listing == names
    # floor 49: the first four are applied; the fourth is younger than 100 s, so it and every
    # later segment stay even though the fifth is old
    assert staging.delete_applied(listing, 49, now - 100) == 3
    assert staging.list() == names[3:]
    # everything applied and old: all but the one that reaches furthest (the reader resumes there)
    os.utime(tmp_path / names[3].filename, (now - 500, now - 500))
    assert staging.delete_applied(staging.list(), 69, now - 100) == 2
    assert staging.list() == names[5:]
    assert staging.delete_applied([], 69, now) == 0


class _TornOnce:
    """A filesystem whose first read of a file comes back torn, as a GET racing the PUT that
    replaces a document on an object store can (a whole document followed by other bytes)."""

    def __init__(self, fs):
        self._fs, self.reads = fs, 0

    def __getattr__(self, name):
        return getattr(self._fs, name)

    def open_input_stream(self, path):
        self.reads += 1
        stream = self._fs.open_input_stream(path)
        if self.reads > 1:
            return stream
        with stream:
            return pa.BufferReader(stream.read() + b'\n  "tail": 1}')


def test_a_torn_read_of_a_document_is_read_again_and_garbage_is_named(tmp_path):
    staging = Staging(str(tmp_path))
    staging.write_apply_status({"tables": [], "pass": 7})
    staging.fs = torn = _TornOnce(staging.fs)
    assert staging.read_apply_status() == {"tables": [], "pass": 7}
    assert torn.reads == 2
    (tmp_path / "apply-status.json").write_text('{"tables": []}{"tables"')
    with pytest.raises(OSError, match=r"apply-status.json is not a JSON document after 5 reads"):
        staging.read_apply_status()
