"""The apply job's pass loop (lakeslot.apply.passes) as the job wires it: its passes follow the
seals the reader is told to make (one seal period, lakeslot.cadence)."""

from __future__ import annotations

import pytest

from lakeslot import workloads
from lakeslot.api.models import PostgresIngestion
from lakeslot.api.naming import TableName
from lakeslot.apply.job import Applier
from lakeslot.apply.outcomes import Hooks
from tests.support.operator_env import OfflineDatabase, ingestion_document


@pytest.mark.parametrize(("apply", "reader", "period"), [
    ({"triggerIntervalSeconds": 5}, {}, 2.5),  # the default: half the interval
    ({"triggerIntervalSeconds": 60}, {"segmentMaxSeconds": 3}, 3.0),
])
def test_passes_follow_the_seal_period_the_reader_is_given(spark, iceberg_namespace, apply, reader,
                                                           period):
    catalog, namespace = iceberg_namespace.split(".", 1)
    document = ingestion_document("passes", OfflineDatabase(), [TableName("public", "t")],
                                  warehouse="/tmp/wh", staging="file:///tmp/staging",
                                  apply=apply, reader=reader)
    document["spec"]["sink"].update(namespace=namespace)
    document["spec"]["sink"]["catalog"]["name"] = catalog
    ingestion = PostgresIngestion.model_validate(document)
    command = workloads.reader_command(ingestion)
    told = float(command[command.index("--segment-max-seconds") + 1])
    applier = Applier(spark, workloads.JobInput(ingestion, ()), Hooks(), 1, 1, environ={})
    try:
        assert applier.passes.lag.period == told == period
    finally:
        applier.close()
