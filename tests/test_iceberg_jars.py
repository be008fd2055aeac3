"""``lakeslot provision-jars`` (lakeslot/spark/jars.py): the cache it trusts, what it lists, and
the probe that stands between a built jar and the manifest.

The cold PyPI route itself (≈70 s, 460 MB of wheels) is not rerun here: ``./dev setup`` runs it once
per machine and every Spark test uses its result; these tests use that cache.
"""

from __future__ import annotations

import json

import pytest

from lakeslot import cli
from lakeslot.spark import jars


@pytest.fixture(scope="module")
def provisioned() -> list:
    try:
        return jars.ensure_jars()
    except jars.JarProvisioningError as e:
        pytest.skip(f"Iceberg jars unavailable: {e}")


def test_a_cache_of_an_older_layout_is_provisioned_again(tmp_path, monkeypatch):
    """A cache of another layout (here none: from before the REST client and the SDK) is not
    trusted, although every jar it lists is there."""
    monkeypatch.setenv("LAKESLOT_CACHE", str(tmp_path))
    jar_dir = tmp_path / "jars"
    jar_dir.mkdir()
    (jar_dir / jars.RUNTIME_JAR).write_bytes(b"x")
    manifest = {"iceberg_version": jars.ICEBERG_VERSION, "source": "pypi-wheels", "reason": "",
                "jars": [{"name": jars.RUNTIME_JAR, "size": 1}]}
    (jar_dir / jars.MANIFEST).write_text(json.dumps(manifest))
    assert jars._cached(jar_dir) is None
    (jar_dir / jars.MANIFEST).write_text(json.dumps({**manifest, "layout": jars.MANIFEST_LAYOUT}))
    assert jars._cached(jar_dir) == [jar_dir / jars.RUNTIME_JAR]


def test_provision_jars_lists_the_route_and_what_each_jar_is_for(provisioned, capsys):
    assert cli.main(["provision-jars"]) == 0
    route, *lines = capsys.readouterr().out.splitlines()
    assert route.startswith(("# pypi-wheels: ", "# maven-central: "))
    assert [line.split("\t")[0] for line in lines] == [str(p) for p in provisioned]
    assert all(len(line.split("\t")[1]) > 20 for line in lines)
    if route.startswith("# pypi-wheels"):
        assert [p.name for p in provisioned] == [jars.RUNTIME_JAR,
                                                 *[b.name for b in jars.BUILDS],
                                                 jars.POSTGRES_JDBC_JAR]
    assert jars.system_class_path(provisioned) == [p for p in provisioned
                                                   if p.name == jars.POSTGRES_JDBC_JAR]


@pytest.mark.parametrize(("missing", "failure"), [
    # the jar of the AWS SDK v2 (either route's): S3FileIO's client, after the probes that pass
    ((jars.AWS_SDK_JAR, jars.maven_url("iceberg-aws-bundle").rsplit("/", 1)[1]),
     r"probe of S3FileIO's S3 client \(AWS SDK v2\) failed .*missing class software[./]amazon[./]awssdk"),
    # the JDBC driver: the last probe, every other jar there
    ((jars.POSTGRES_JDBC_JAR,),
     r"probe of the PostgreSQL JDBC driver .* failed .*missing class org\.postgresql\.Driver"),
])
def test_the_probe_names_what_does_not_load(provisioned, missing, failure):
    """Without a jar, the probe fails on the first client that needs it and names the missing
    class."""
    without = [p for p in provisioned if p.name not in missing]
    assert len(without) == len(provisioned) - 1
    with pytest.raises(jars.JarProvisioningError, match=failure):
        jars._probe(without)
