"""The image the chart deploys (Dockerfile) agrees with the code that uses it.

No Docker engine runs here, so the image is never built in tests: this checks what can be checked
from the text — the versions it installs are the ones the code expects (Spark = the CRD's default
``spec.spark.sparkVersion``, Iceberg = what ``lakeslot provision-jars`` provisions, for the runtime
and its aws, gcp and azure bundles alike, each SHA-1-checked from lakeslot's Maven URL, and so is the
PostgreSQL JDBC driver, also checked against the SHA-256 lakeslot pins; Python = the package's),
the Spark jobs' directory is where the SparkApplications' ``mainApplicationFile`` points,
the commands the chart and the reader Deployment run exist, the user is the one the pods run as,
nothing from the build context it copies is excluded by .dockerignore, and no credential is baked
in as an ARG or ENV.
"""

from __future__ import annotations

import fnmatch
import inspect
import re
import tomllib
from pathlib import Path

from lakeslot import workloads
from lakeslot.api.models import PostgresIngestion, SparkSpec
from lakeslot.spark import jars
from lakeslot_operator import children
from tests.api_cases import base_document
from tests.support import chart

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = (ROOT / "Dockerfile").read_text()
FINAL_STAGE = DOCKERFILE[DOCKERFILE.rindex("\nFROM "):]


def instructions(name: str, text: str = DOCKERFILE) -> list[str]:
    """Arguments of every ``name`` instruction (continuation lines joined)."""
    joined = re.sub(r"\\\n\s*", " ", text)
    return [m.group(1).strip() for m in re.finditer(rf"^{name}\s+(.*)$", joined, re.M)]


def arg_default(name: str) -> str:
    (value,) = [a.split("=", 1)[1] for a in instructions("ARG") if a.startswith(f"{name}=")]
    return value


def expand(template: str, **values: str) -> str:
    """``template`` with each ``${name}`` of ``values`` replaced (as the shell does)."""
    for name, value in values.items():
        template = template.replace(f"${{{name}}}", value)
    return template


def download(path: str) -> tuple[str, str, str]:
    """The RUN that downloads from ``path`` on Maven Central, and its ``jar`` and ``url``
    templates."""
    (run,) = [r for r in instructions("RUN") if f"repo1.maven.org/maven2/{path}/" in r]
    jar_match = re.search(r'jar="([^"]+)"', run)
    url_match = re.search(r'url="([^"]+)"', run)
    assert jar_match and url_match, run
    return run, jar_match.group(1), url_match.group(1)


def test_versions_are_the_ones_the_code_expects():
    assert arg_default("SPARK_VERSION") == SparkSpec().spark_version
    assert arg_default("ICEBERG_VERSION") == jars.ICEBERG_VERSION
    run, jar_template, url_template = download("org/apache/iceberg")
    loop = re.search(r"for artifact in ([^;]+); do", run)
    assert loop, run
    # the runtime and Iceberg's aws, gcp and azure bundles, each of the runtime's version, each
    # from the URL lakeslot's Maven route uses, each checked against Maven's checksum
    artifacts = loop.group(1).split()
    assert artifacts == [jars.RUNTIME_ARTIFACT, *jars.BUNDLE_ARTIFACTS]
    assert set(jars.LOCAL_MAVEN_ARTIFACTS) <= set(artifacts)
    version = jars.ICEBERG_VERSION
    for artifact in artifacts:
        jar = expand(jar_template, artifact=artifact, ICEBERG_VERSION=version)
        assert expand(url_template, jar=jar, artifact=artifact, ICEBERG_VERSION=version) == \
            jars.maven_url(artifact)
    assert expand(jar_template, artifact=jars.RUNTIME_ARTIFACT,
                  ICEBERG_VERSION=version) == jars.RUNTIME_JAR
    assert 'sha1sum -c -' in run and '"${url}.sha1"' in run
    assert "mv /tmp/jars/*.jar" in " ".join(instructions("RUN", FINAL_STAGE))  # all of them
    assert any('"pyspark==${SPARK_VERSION}"' in r for r in instructions("RUN", FINAL_STAGE))
    python_match = re.match(r"python:(\d+\.\d+)-", arg_default("PYTHON_IMAGE"))
    assert python_match, arg_default("PYTHON_IMAGE")
    python = python_match.group(1)
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    assert f">={python}" in requires


def test_the_jdbc_driver_is_the_one_the_code_provisions():
    """The PostgreSQL JDBC driver (Iceberg's JDBC catalog on PostgreSQL): lakeslot's version, from
    lakeslot's Maven URL, checked against Maven's SHA-1 and the SHA-256 lakeslot pins for the
    copy its PyPI route takes (the same bytes), into the jars the final stage puts on Spark's
    class path."""
    version = arg_default("POSTGRES_JDBC_VERSION")
    assert version == jars.POSTGRES_JDBC_VERSION
    assert arg_default("POSTGRES_JDBC_SHA256") == jars.POSTGRES_JDBC_SHA256
    run, jar_template, url_template = download("org/postgresql/postgresql")
    jar = expand(jar_template, POSTGRES_JDBC_VERSION=version)
    assert jar == jars.POSTGRES_JDBC_JAR
    assert expand(url_template, jar=jar, POSTGRES_JDBC_VERSION=version) == jars.POSTGRES_JDBC_URL
    assert 'sha1sum -c -' in run and '"${url}.sha1"' in run
    assert '"${POSTGRES_JDBC_SHA256}  ${jar}" | sha256sum -c -' in run
    (stage,) = [s for s in DOCKERFILE.split("\nFROM ") if "org/postgresql" in s]
    assert {"POSTGRES_JDBC_VERSION", "POSTGRES_JDBC_SHA256"} <= set(instructions("ARG", stage))
    assert stage.startswith("${PYTHON_IMAGE} AS iceberg")  # (the stage whose jars the last one takes)


def test_the_spark_jobs_are_where_the_spark_applications_look():
    main_files = set(re.findall(r'"local://(/[^"]+)"', inspect.getsource(children)))
    assert {Path(f).name for f in main_files} >= {"snapshot.py", "apply.py"}
    copies = [c.split() for c in instructions("COPY", FINAL_STAGE) if not c.startswith("--")]
    for main_file in main_files:
        directory = str(Path(main_file).parent)
        assert directory in [dest for *sources, dest in copies if sources == ["spark_jobs"]]
    assert (ROOT / "spark_jobs").is_dir()


def test_the_commands_run_from_the_image_exist():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert chart.operator_container(chart.render(chart.SERVED))["command"][0] in scripts
    ingestion = PostgresIngestion.model_validate(base_document())
    assert workloads.reader_command(ingestion)[:2] == ["lakeslot", "reader"]
    assert "lakeslot" in scripts


def test_it_runs_as_the_user_the_pods_run_as():
    (user,) = instructions("USER", FINAL_STAGE)
    pod = chart.one(chart.render(chart.SERVED), "Deployment")["spec"]["template"]["spec"]
    assert int(user) == pod["securityContext"]["runAsUser"]
    assert f"--uid {user}" in " ".join(instructions("RUN", FINAL_STAGE))


def test_nothing_it_copies_is_ignored_and_no_credential_is_baked_in():
    ignored = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")]
    sources = {s for c in instructions("COPY") if not c.startswith("--") for s in c.split()[:-1]}
    assert sources == {"pyproject.toml", "README.md", "lakeslot", "operator", "spark_jobs",
                       "lakeslot/spark/java"}
    for source in sources:
        assert (ROOT / source).exists()
        assert not any(fnmatch.fnmatch(source, pattern) for pattern in ignored), source
    names = [re.split(r"[= ]", a, maxsplit=1)[0] for a in instructions("ARG") + instructions("ENV")]
    assert not [n for n in names if re.search(r"PASSWORD|SECRET|TOKEN|CREDENTIAL|KEY", n, re.I)]


def test_it_compiles_the_java_helpers_the_code_compiles_and_puts_them_on_sparks_class_path():
    """The image has no JDK at run time: its helpers stage compiles lakeslot/spark/java as
    lakeslot.spark.helpers does where a JDK is (same sources, same release), and the jar joins
    Spark's jars (where Iceberg's are: RowDeltas must see them)."""
    from lakeslot.spark import helpers

    (javac,) = [r for r in instructions("RUN") if r.startswith("javac ")]
    assert f"--release {helpers.RELEASE} " in javac
    assert "COPY lakeslot/spark/java /java" in DOCKERFILE and "/java/*.java" in javac
    assert {s.parent for s in helpers.SOURCES} == {ROOT / "lakeslot/spark/java"}
    assert "COPY --from=helpers /lakeslot-helpers.jar /tmp/jars/" in FINAL_STAGE
    assert 'mv /tmp/jars/*.jar "${SPARK_HOME}/jars/"' in " ".join(instructions("RUN", FINAL_STAGE))
