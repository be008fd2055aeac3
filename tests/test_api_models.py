"""The pydantic models and the pure helpers around them: round trips, identifiers, names,
conditions, LSNs, times and update (transition) rules."""

from __future__ import annotations

import functools
import math
import re
from datetime import UTC, datetime, timedelta, timezone
from typing import get_args

import pytest
import yaml
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from lakeslot import lsn_text
from lakeslot.api.catalog_types import CATALOG_TYPES
from lakeslot.api.conditions import find_condition, set_condition
from lakeslot.api.crd import openapi_schema
from lakeslot.api.models import (
    CatalogSpec,
    CatalogType,
    Condition,
    PostgresIngestion,
    PostgresIngestionStatus,
    SourceSpec,
    TableSpec,
)
from lakeslot.api.naming import (
    IngestionNames,
    TableName,
    default_replication_name,
    effective_publication_name,
    effective_slot_name,
    iceberg_table_name,
)
from lakeslot.api.reference import walk_schema
from lakeslot.api.validation import parse_resource, problems_of, validate_text, validate_update
from lakeslot.mirror.catalogs import TABLE_CACHE_EXPIRY_MS, folding, pyiceberg_properties, spark_conf
from lakeslot.spark.tables import cache_hold_s
from tests.api_cases import EXAMPLES, UPDATE_CASES, apply_edits, base_document

T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)


# ---------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda path: path.name)
def test_yaml_model_yaml_round_trip(path):
    document = yaml.safe_load(path.read_text())
    resource = parse_resource(document)
    dumped = yaml.safe_dump(resource.to_document())
    assert resource.to_document() == document  # only what was written: defaults stay implicit
    assert parse_resource(yaml.safe_load(dumped)) == resource


def test_full_example_sets_every_spec_field():
    document = yaml.safe_load(EXAMPLES[1].read_text())
    spec_schema = openapi_schema()["properties"]["spec"]
    fields = {path for path, _, role in walk_schema(spec_schema, "spec") if role in ("required", "optional")}
    written = {path for path, _, _ in _walk_document(document["spec"], "spec")}
    assert fields - written == set()


def _walk_document(value, path):
    yield path, value, None
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _walk_document(item, f"{path}.{key}")
            yield from _walk_document(item, f"{path}.<key>")
    if isinstance(value, list):
        for item in value:
            yield from _walk_document(item, f"{path}[]")


def test_python_uses_snake_case_and_documents_camel_case():
    source = SourceSpec(host="db", database="shop", user="u", slot_name="s", tables=[TableSpec(name="t")])
    assert source.to_document() == {
        "host": "db",
        "database": "shop",
        "user": "u",
        "slotName": "s",
        "tables": [{"name": "t"}],
    }
    with pytest.raises(ValidationError, match="slot_name"):
        parse_resource(apply_edits(base_document(), (("spec.source.slot_name", "s"),)))


def test_defaults_are_filled_in():
    spec = parse_resource(base_document()).spec
    assert (spec.source.port, spec.source.ssl_mode, spec.source.tables[0].schema_name) == (5432, "prefer", "public")
    assert (spec.snapshot.mode, spec.policies.deletion_policy, spec.suspend) == ("initial", "Retain", False)
    assert spec.source.slot_name is None and spec.source.options == {}


def test_strict_types_like_the_api_server():
    for edits in [(("spec.source.port", 5432.0),), (("spec.suspend", 1),), (("spec.source.host", 42),)]:
        with pytest.raises(ValidationError):
            parse_resource(apply_edits(base_document(), edits))


# ---------------------------------------------------------------------------- identifiers

ODD_BUT_LEGAL = ["Order Lines", "select", 'say "hi"', "Ünïcödé", "表" * 21, "a" * 63, "public.orders", "tab\tle"]


@pytest.mark.parametrize("name", ODD_BUT_LEGAL)
def test_any_postgres_identifier_is_accepted(name):
    table = parse_resource(apply_edits(base_document(), (("spec.source.tables[0]", {"schema": name, "name": name}),)))
    assert table.spec.source.tables[0].name == name


@pytest.mark.parametrize(
    ("name", "ok"), [("é" * 31 + "a", True), ("é" * 32, False), ("😀" * 15 + "abc", True), ("😀" * 16, False)]
)
def test_identifier_limit_counts_utf8_bytes(name, ok):
    document = apply_edits(base_document(), (("spec.source.publicationName", name),))
    if ok:
        parse_resource(document)
    else:
        with pytest.raises(ValidationError, match="longer than 63 bytes"):
            parse_resource(document)


def test_duplicate_tables_compare_after_the_schema_default():
    document = apply_edits(
        base_document(), (("spec.source.tables", [{"name": "t"}, {"schema": "public", "name": "t"}]),)
    )
    with pytest.raises(ValidationError) as raised:
        parse_resource(document)
    assert [problem.path for problem in problems_of(raised.value)] == ["spec.source.tables[1]"]


def test_same_table_name_in_two_schemas_is_fine():
    tables = [{"schema": "a", "name": "t"}, {"schema": "A", "name": "t"}, {"name": "t"}]
    parse_resource(apply_edits(base_document(), (("spec.source.tables", tables),)))


# ---------------------------------------------------------------------------- names


def test_default_name_is_readable_when_lossless():
    assert default_replication_name("prod", "orders") == "lakeslot_prod_orders"


@pytest.mark.parametrize(
    ("first", "second"),
    [
        (("a-b", "c"), ("a", "b-c")),
        (("a", "b.c"), ("a", "b-c")),
        (("n", "x" * 60), ("n", "x" * 61)),
        (("ab", "c"), ("a", "bc")),
    ],
)
def test_default_names_of_different_resources_differ(first, second):
    assert default_replication_name(*first) != default_replication_name(*second)


@pytest.mark.parametrize(("namespace", "name"), [("prod", "orders"), ("team-a", "orders.v2"), ("n" * 63, "x" * 253)])
def test_default_name_is_a_valid_slot_name(namespace, name):
    derived = default_replication_name(namespace, name)
    assert re.fullmatch(r"[a-z0-9_]{1,63}", derived)
    assert derived == default_replication_name(namespace, name)
    assert derived.startswith("lakeslot_")


def test_default_name_of_a_long_name_is_truncated_with_a_hash():
    derived = default_replication_name("analytics", "x" * 100)
    assert len(derived) == 63
    assert re.fullmatch(r"lakeslot_analytics_x+_[0-9a-f]{8}", derived)


def test_effective_names_prefer_the_spec():
    source = parse_resource(base_document()).spec.source
    assert effective_slot_name("shop", "orders", source) == "lakeslot_shop_orders"
    named = source.model_copy(update={"slot_name": "mine", "publication_name": "Pub"})
    assert (effective_slot_name("shop", "orders", named), effective_publication_name("shop", "orders", named)) == (
        "mine",
        "Pub",
    )


@pytest.mark.parametrize(
    ("schema", "table", "expected"),
    [
        ("public", "orders", "public__orders"),  # plain names keep the name they always had
        ("public", "_prisma_migrations", "public___prisma_migrations"),
        # the hash is part of the contract: a mirror keeps its name across versions
        ("Sales", "Order Lines", "sales__order_lines_c2765b86"),
        ('Sales "EU"', "Order Lines", "sales__eu___order_lines_95436ecc"),
        ("s", 'a"b.c', "s__a_b_c_2b9aca81"),
        # a schema ambiguous at the separator: a hash too, so a.b__c keeps the readable name
        ("a__b", "c", "a__b__c_a92700ce"),
        ("a", "b__c", "a__b__c"),
        ("a_", "b", "a___b_a00766a3"),
    ],
)
def test_iceberg_table_name(schema, table, expected):
    assert iceberg_table_name("{schema}__{table}", schema, table) == expected


@pytest.mark.parametrize(("one", "other"), [
    (("app", "Users"), ("app", "users")),
    (("app", "USERS"), ("app", "Users")),
    (("public", "таблица"), ("public", "столбец")),  # equal length: the same readable name
    (("Sales", "x"), ("sales", "x")),
    (("a b", "c"), ("a_b", "c")),
])
def test_names_that_differ_only_in_case_or_script_get_different_mirrors(one, other):
    template = "{schema}__{table}"
    assert iceberg_table_name(template, *one) != iceberg_table_name(template, *other)


def _names(tables: list[dict], **sink) -> IngestionNames:
    return IngestionNames.of(PostgresIngestion.model_validate({
        "apiVersion": "lakeslot.io/v1alpha1", "kind": "PostgresIngestion",
        "metadata": {"name": "shop", "namespace": "prod"},
        "spec": {"source": {"host": "db", "database": "app", "user": "u", "tables": tables,
                            "schemas": ["public"]},
                 "sink": {"catalog": {"type": "hadoop", "warehouse": "file:///w"},
                          "namespace": "mirror", **sink},
                 "staging": {"uri": "file:///s"}}}))


def test_tables_that_still_map_to_one_mirror_are_refused_naming_each_other():
    """Under a template with a one-character separator (names left as they were)."""
    ab_c, a_bc, plain = TableName("a_b", "c"), TableName("a", "b_c"), TableName("a", "d")
    names = _names([{"schema": "a", "name": "d"}], tableNameTemplate="{schema}_{table}")
    refused = names.collisions([ab_c, a_bc, plain])
    assert set(refused) == {ab_c, a_bc}
    assert str(a_bc) in refused[ab_c] and str(ab_c) in refused[a_bc]
    assert "mirror.a_b_c" in refused[ab_c]
    # the one that was mirrored before keeps its mirror; the newcomer is refused
    assert set(names.collisions([ab_c, a_bc, plain], established={ab_c})) == {a_bc}
    # two established ones (they shared it: the bug this guards against) are both refused
    assert set(names.collisions([ab_c, a_bc], established={ab_c, a_bc})) == {ab_c, a_bc}


def test_the_name_an_earlier_version_gave_is_known_where_it_differs():
    names = _names([{"schema": "x__y", "name": "kept", "mirrorName": "x__y__kept"}])
    assert names.earlier_mirror_table(TableName("a__b", "c")) == "a__b__c"
    assert names.earlier_mirror_table(TableName("a", "b__c")) is None  # the same name
    assert names.earlier_mirror_table(TableName("x__y", "kept")) is None  # its mirrorName rules


_NAME_PARTS = st.lists(st.sampled_from(["a", "b", "_", "__", "A", "-", " ", '"', "é", "ж", "1"]),
                       min_size=1, max_size=5).map("".join)


@functools.cache
def _default_names() -> IngestionNames:
    return _names([])


@settings(max_examples=400, deadline=None)
@given(st.tuples(_NAME_PARTS, _NAME_PARTS), st.tuples(_NAME_PARTS, _NAME_PARTS),
       st.sampled_from(["{schema}__{table}", "{table}__in__{schema}", "pre_{schema}.._{table}_post"]))
@example(("a__b", "c"), ("a", "b__c"), "{schema}__{table}")  # the separator's ambiguity
@example(("a_", "b"), ("a", "_b"), "{schema}__{table}")
@example(("A", "b"), ("a", "b"), "{schema}__{table}")  # case
@example(("b", "a__"), ("_b", "a"), "{table}__in__{schema}")
def test_mirror_names_are_injective_under_a_template_that_separates_schema_and_table(
        one, other, template):
    """Property over schema/table names with ``_``, ``__``, case, punctuation and unicode: two
    different tables get different mirror names under the default template (and others naming
    schema and table apart by two characters or more), so none is refused for its name."""
    first, second = TableName(*one), TableName(*other)
    assume(first != second)
    names = _default_names() if template == "{schema}__{table}" else _names([], tableNameTemplate=template)
    assert names.mirror_table(first) != names.mirror_table(second)
    assert names.collisions([first, second]) == {}


def test_mirror_name_overrides_the_template_and_resolves_a_collision():
    names = _names([{"schema": "a_b", "name": "c", "mirrorName": "abc_mirror"}],
                   tableNameTemplate="{schema}_{table}")
    assert names.mirror_table(TableName("a_b", "c")) == "abc_mirror"
    assert names.mirror_table(TableName("a", "b_c")) == "a_b_c"
    assert names.collisions([TableName("a_b", "c"), TableName("a", "b_c")]) == {}
    taken = _names([{"schema": "a", "name": "x", "mirrorName": "a__b"}])  # another's mirror
    assert set(taken.collisions([TableName("a", "x"), TableName("a", "b")])) == {
        TableName("a", "x"), TableName("a", "b")}


def test_a_template_without_the_schema_and_changelog_names_collide_too():
    names = _names([], tableNameTemplate="{table}")
    one, other = TableName("eu", "orders"), TableName("us", "orders")
    assert set(names.collisions([one, other])) == {one, other}
    logged = _names([], changelog={"enabled": True})  # suffix __changes
    orders, history = TableName("public", "orders"), TableName("public", "orders__changes")
    refused = logged.collisions([orders, history])
    assert set(refused) == {orders, history}
    assert "changelog" in refused[orders] or "changelog" in refused[history]


def test_validation_refuses_listed_tables_that_share_a_mirror():
    text = yaml.safe_dump({
        "apiVersion": "lakeslot.io/v1alpha1", "kind": "PostgresIngestion",
        "metadata": {"name": "shop"},
        "spec": {"source": {"host": "db", "database": "app", "user": "u",
                            "tables": [{"schema": "a_b", "name": "c"}, {"schema": "a", "name": "b_c"}]},
                 "sink": {"catalog": {"type": "hadoop", "warehouse": "file:///w"}, "namespace": "m",
                          "tableNameTemplate": "{schema}_{table}"},
                 "staging": {"uri": "file:///s"}}})
    [report] = validate_text(text)
    assert report.resource is None
    assert [p.path for p in report.problems] == ["spec.source.tables[0]", "spec.source.tables[1]"]
    # each fix proposes a mirrorName of its own, not the shared one
    proposed = [re.findall(r"for example '([^']+)'", p.fix)[0] for p in report.problems]
    assert len(set(proposed)) == 2 and "a_b_c" not in proposed



def test_the_cuts_records_names_are_no_mirrors():
    names = _names([{"schema": "public", "name": "t", "mirrorName": "lakeslot_cuts_default_x"}])
    assert names.cuts_table == "lakeslot_cuts_prod_shop"
    assert names.cuts_identifier()[-1] == names.cuts_table
    t, plain = TableName("public", "t"), TableName("public", "u")
    refused = names.collisions([t, plain])
    assert set(refused) == {t} and "reserved for lakeslot's cuts records" in refused[t]


# ---------------------------------------------------------------------------- conditions


def ready(status="True", reason="Streaming", message="", now=T0):
    return {"type_": "Ready", "status": status, "reason": reason, "message": message, "now": now}


def test_set_condition_adds_a_new_condition():
    conditions = set_condition([], **ready(), observed_generation=3)
    assert conditions == [
        Condition(
            type="Ready", status="True", reason="Streaming", message="", last_transition_time=T0, observed_generation=3
        )
    ]


def test_same_status_keeps_the_transition_time():
    first = set_condition([], **ready())
    later = set_condition(first, **ready(reason="StillStreaming", message="fine", now=T0 + timedelta(hours=1)))
    assert later[0].last_transition_time == T0
    assert (later[0].reason, later[0].message) == ("StillStreaming", "fine")


def test_flipped_status_moves_the_transition_time_and_keeps_order():
    conditions = set_condition(set_condition([], **ready()), "SlotReady", "True", "SlotActive", "", now=T0)
    flipped = set_condition(conditions, **ready(status="False", reason="SlotLost", now=T0 + timedelta(minutes=5)))
    assert [condition.type for condition in flipped] == ["Ready", "SlotReady"]
    assert flipped[0].last_transition_time == T0 + timedelta(minutes=5)
    assert conditions[0].status == "True"  # input untouched
    assert find_condition(flipped, "SlotReady") == conditions[1]
    assert find_condition(flipped, "Degraded") is None


def test_condition_reason_must_be_camel_case():
    with pytest.raises(ValidationError, match="reason"):
        set_condition([], **ready(reason="slot lost"))


# ---------------------------------------------------------------------------- LSNs and times


@pytest.mark.parametrize(
    ("value", "text"),
    [(0, "0/0"), (0x16B3748, "0/16B3748"), (0x1_0000_0000, "1/0"), ((1 << 64) - 1, "FFFFFFFF/FFFFFFFF")],
)
def test_lsn_text_form(value, text):
    assert lsn_text.format(value) == text
    assert lsn_text.parse(text) == value
    assert lsn_text.parse(text.lower()) == value


@pytest.mark.parametrize("text", ["", "16B3748", "0/", "G/0", "0/123456789"])
def test_not_an_lsn(text):
    with pytest.raises(ValueError, match="not a PostgreSQL LSN"):
        lsn_text.parse(text)


def test_times_are_utc_seconds_and_need_a_zone():
    local = datetime(2024, 5, 1, 14, 0, 0, 123456, tzinfo=timezone(timedelta(hours=2)))
    condition = Condition(type="Ready", status="True", reason="Ok", last_transition_time=local)
    assert condition.model_dump(mode="json", by_alias=True)["lastTransitionTime"] == "2024-05-01T12:00:00Z"
    naive = datetime(2024, 5, 1)  # noqa: DTZ001 - the point: a time without a zone is refused
    with pytest.raises(ValidationError, match="zone"):
        Condition(type="Ready", status="True", reason="Ok", last_transition_time=naive)


def test_full_status_round_trip():
    document = {
        "observedGeneration": 2,
        "phase": "Streaming",
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "Streaming",
                "message": "",
                "lastTransitionTime": "2024-05-01T12:00:00Z",
            }
        ],
        "publicationName": "lakeslot_shop_orders",
        "slot": {
            "name": "lakeslot_shop_orders",
            "activePid": 4242,
            "holder": "shop/orders-reader-5d8f",
            "confirmedFlushLsn": "0/16B3748",
            "restartLsn": "0/16B3700",
            "walStatus": "reserved",
            "safeWalSize": 1073741824,
            "retainedBytes": 72,
        },
        "tables": [
            {
                "schema": "public",
                "name": "orders",
                "state": "Streaming",
                "snapshotLsn": "0/15D68C8",
                "appliedLsn": "0/16B3748",
                "rowsKnown": 10,
                "rowsStaged": 0,
            }
        ],
        "tableCount": 1,
        "lagBytes": 0,
        "reader": {"pod": "orders-reader-5d8f", "durableLsn": "0/16B3748", "lagBytes": 0},
        "apply": {"appliedLsn": "0/16B3748", "lastCommitTime": "2024-05-01T12:00:05Z"},
        "observedResnapshotGeneration": 0,
    }
    status = PostgresIngestionStatus.model_validate(document, by_name=False)
    assert status.to_document() == document
    with pytest.raises(ValidationError, match="pattern"):
        PostgresIngestionStatus.model_validate({"slot": {"restartLsn": "0/16b3700"}})


# ---------------------------------------------------------------------------- updates


@pytest.mark.parametrize("case", UPDATE_CASES, ids=lambda case: case.id)
def test_transition_rules_reject_the_update(case):
    old, new = parse_resource(case.old()), parse_resource(case.new())
    assert [problem.path for problem in validate_update(old, new)] == [case.path]


@pytest.mark.parametrize(
    "edits",
    [
        (),
        (("spec.source.slotName", "orders_slot"),),
        (("spec.snapshot.resnapshotGeneration", 1),),
        (("spec.source.port", 6432),),
    ],
    ids=["unchanged", "slot-name-set-first-time", "resnapshot-requested", "mutable-field"],
)
def test_allowed_updates(edits):
    old = parse_resource(base_document())
    assert validate_update(old, parse_resource(apply_edits(base_document(), edits))) == ()


# ---------------------------------------------------------------------------- secret hygiene


def test_catalog_secret_keys_sharing_an_environment_variable_are_refused_offline():
    """Checked offline and by the operator (InvalidSpec), not in CEL (every pair of keys: over
    the API server's cost budget): the error names the keys and the variable they share."""
    document = apply_edits(base_document(), (("spec.sink.catalog.secretProperties", {
        "s3.secret-access-key": {"name": "s3", "key": "a"}, "S3_SECRET.ACCESS-KEY": {"name": "s3", "key": "b"},
        "jdbc.password": {"name": "pg", "key": "p"}}),))
    with pytest.raises(ValidationError) as raised:
        parse_resource(document)
    (problem,) = problems_of(raised.value)
    assert problem.path == "spec.sink.catalog.secretProperties"
    assert "S3_SECRET.ACCESS-KEY, s3.secret-access-key → LAKESLOT_CATALOG_S3_SECRET_ACCESS_KEY" in problem.problem
    assert "keep one key of each" in problem.fix
    one = apply_edits(document, (("spec.sink.catalog.secretProperties", {
        "s3.secret-access-key": {"name": "s3", "key": "a"}, "jdbc.password": {"name": "pg", "key": "p"}}),))
    assert parse_resource(one).spec.sink.catalog.secret_properties["jdbc.password"].key == "p"


def test_plain_catalog_properties_that_are_no_credentials_are_accepted():
    document = apply_edits(base_document(), (("spec.sink.catalog.properties", {
        "token-refresh-enabled": "true", "s3.access-key-id": "AKIA", "oauth2-server-uri": "https://x",
        "rest.auth.type": "oauth2"}),))
    assert parse_resource(document).spec.sink.catalog.properties["token-refresh-enabled"] == "true"


def test_secret_names_like_lakeslots_but_not_its_own_are_accepted():
    for name in ("orders-pg", "orders-applications", "orders-readers", "other-apply-input", "orders"):
        document = apply_edits(base_document(), (("spec.source.passwordSecretRef", {"name": name, "key": "p"}),))
        ref = parse_resource(document).spec.source.password_secret_ref
        assert ref is not None and ref.name == name


# ---------------------------------------------------------------------------- catalog types


def test_spark_holds_the_mirrors_for_minutes_unless_the_catalog_properties_say_otherwise():
    """The apply job's held mirrors (lakeslot.apply.table_pass) outlive a pass of more than
    Iceberg's 30-s default; the catalog's own properties win, and what the job takes as held
    follows them (lakeslot.spark.tables.cache_hold_s: half the expiry)."""
    key = "spark.sql.catalog.c.cache.expiration-interval-ms"
    ours = spark_conf(CatalogSpec(name="c", type="hadoop", warehouse="/w"))
    assert ours[key] == str(TABLE_CACHE_EXPIRY_MS) and TABLE_CACHE_EXPIRY_MS >= 300_000
    assert cache_hold_s(ours, "c") == TABLE_CACHE_EXPIRY_MS / 2000
    for properties, held_s in (({"cache.expiration-interval-ms": "5000"}, 2.5),
                               ({"cache.expiration-interval-ms": "-1"}, math.inf),
                               ({"cache.expiration-interval-ms": "0"}, 0.0),
                               ({"cache-enabled": "false"}, 0.0)):
        conf = spark_conf(CatalogSpec(name="c", type="hadoop", warehouse="/w", properties=properties))
        assert {k: conf[f"spark.sql.catalog.c.{k}"] for k in properties} == properties
        assert cache_hold_s(conf, "c") == held_s


@pytest.mark.parametrize("kind", sorted(CATALOG_TYPES))
def test_every_catalog_type_has_its_rules_and_both_translations(kind):
    """The registry (lakeslot.api.catalog_types) is the API's list of types, its rules follow
    the registry, and each type is translated for Spark and for pyiceberg."""
    assert set(get_args(CatalogType)) == set(CATALOG_TYPES)
    entry = CATALOG_TYPES[kind]
    with pytest.raises(ValidationError) as refused:  # every type needs a uri or a warehouse
        CatalogSpec.model_validate({"type": kind})
    assert ("catalogs need a uri" in str(refused.value)) == entry.needs_uri
    assert ("catalogs need a warehouse" in str(refused.value)) == entry.needs_warehouse
    catalog = CatalogSpec.model_validate({"type": kind, "uri": "jdbc:postgresql://db/iceberg" if kind == "jdbc"
                                          else "http://catalog", "warehouse": "/tmp/w" if entry.warehouse_path
                                          else "s3://bucket/w"})
    spark = spark_conf(catalog)
    assert {k.removeprefix(f"spark.sql.catalog.{catalog.name}."): v for k, v in spark.items()}.items() \
        >= dict(entry.spark).items()
    options = pyiceberg_properties(catalog, {})
    assert options.get("type") == entry.pyiceberg
    assert (folding(catalog) is not None) == entry.folds_case
