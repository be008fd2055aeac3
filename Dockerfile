# syntax=docker/dockerfile:1
#
# The lakeslot image: the operator (`lakeslot operator`), the replication reader
# (`lakeslot reader`) and the Spark jobs (/opt/lakeslot/spark_jobs/*.py, submitted by the
# spark-operator) on Python 3.11, Java 17 and Spark 3.5 with Iceberg's Spark runtime jar, its AWS,
# GCP and Azure bundles and the PostgreSQL JDBC driver (a JDBC catalog on PostgreSQL).
# It runs as the unprivileged user 10001 and holds no credentials: they come from Kubernetes
# Secrets at run time.
#
#   docker build -t ghcr.io/lakeslot/lakeslot:0.1.0 .
#
# SPARK_VERSION is the pyspark it installs (the CRD's default spec.spark.sparkVersion),
# ICEBERG_VERSION and POSTGRES_JDBC_VERSION (with the driver's SHA-256) the ones
# lakeslot/spark/jars.py provisions; tests/test_helm_image.py keeps them, and the paths and user
# the operator puts into its children, in step with the code. It is not built in CI (no Docker
# engine there).
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
ARG SPARK_VERSION=3.5.9
ARG ICEBERG_VERSION=1.10.2
ARG POSTGRES_JDBC_VERSION=42.7.4
ARG POSTGRES_JDBC_SHA256=188976721ead8e8627eb6d8389d500dccc0c9bebd885268a3047180274a6031e

# Spark's Kubernetes entrypoint (driver, executor, pass-through), from the official Spark image.
FROM apache/spark:${SPARK_VERSION}-scala2.12-java17-ubuntu AS spark

# Iceberg's Spark runtime jar (its REST catalog client included) and Iceberg's bundles of the
# object-store clients of the same version — aws (S3FileIO, Glue; the AWS SDK v2), gcp (GCSFileIO),
# azure (ADLSFileIO) — from Maven Central, each checked against Maven's SHA-1.
FROM ${PYTHON_IMAGE} AS iceberg
ARG ICEBERG_VERSION
RUN apt-get update \
 && apt-get install -y --no-install-recommends curl ca-certificates \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /jars
RUN set -eux; \
    for artifact in iceberg-spark-runtime-3.5_2.12 iceberg-aws-bundle iceberg-gcp-bundle iceberg-azure-bundle; do \
      jar="${artifact}-${ICEBERG_VERSION}.jar"; \
      url="https://repo1.maven.org/maven2/org/apache/iceberg/${artifact}/${ICEBERG_VERSION}/${jar}"; \
      curl -fsSLo "${jar}" "${url}"; \
      echo "$(curl -fsSL "${url}.sha1")  ${jar}" | sha1sum -c -; \
    done
# The PostgreSQL JDBC driver, for Iceberg's JDBC catalog on PostgreSQL: checked against Maven's
# SHA-1 and the SHA-256 lakeslot/spark/jars.py pins. On Spark's class path (below) DriverManager
# finds it from any thread.
ARG POSTGRES_JDBC_VERSION
ARG POSTGRES_JDBC_SHA256
RUN set -eux; \
    jar="postgresql-${POSTGRES_JDBC_VERSION}.jar"; \
    url="https://repo1.maven.org/maven2/org/postgresql/postgresql/${POSTGRES_JDBC_VERSION}/${jar}"; \
    curl -fsSLo "${jar}" "${url}"; \
    echo "$(curl -fsSL "${url}.sha1")  ${jar}" | sha1sum -c -; \
    echo "${POSTGRES_JDBC_SHA256}  ${jar}" | sha256sum -c -

# lakeslot's Java helpers (lakeslot/spark/java; lakeslot/spark/helpers.py says what each is for),
# compiled against the Iceberg jars above and Spark's own (py4j's among them), as
# lakeslot/spark/helpers.py compiles them where a JDK is; the image itself has only the runtime.
FROM ${PYTHON_IMAGE} AS helpers
RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jdk-headless \
 && rm -rf /var/lib/apt/lists/*
COPY --from=iceberg /jars/ /jars/
COPY --from=spark /opt/spark/jars/ /spark-jars/
COPY lakeslot/spark/java /java
RUN javac --release 11 -nowarn -cp "/jars/*:/spark-jars/*" -d /classes /java/*.java \
 && jar cf /lakeslot-helpers.jar -C /classes .

FROM ${PYTHON_IMAGE}
ARG SPARK_VERSION
RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless tini procps \
 && rm -rf /var/lib/apt/lists/*

# lakeslot with its dependencies; pyspark pinned to SPARK_VERSION.
COPY pyproject.toml README.md /src/
COPY lakeslot /src/lakeslot
COPY operator /src/operator
COPY spark_jobs /src/spark_jobs
RUN pip install --no-cache-dir /src "pyspark==${SPARK_VERSION}" && rm -rf /src

# SPARK_HOME is pyspark's distribution (bin/, jars/); Iceberg, the JDBC driver and lakeslot's
# helpers join its class path.
ENV SPARK_HOME=/opt/spark
RUN ln -s "$(python -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))')" "${SPARK_HOME}"
COPY --from=iceberg /jars/ /tmp/jars/
COPY --from=helpers /lakeslot-helpers.jar /tmp/jars/
RUN mv /tmp/jars/*.jar "${SPARK_HOME}/jars/" && rmdir /tmp/jars
COPY --from=spark /opt/entrypoint.sh /opt/decom.sh /opt/

# The Spark jobs' main files: mainApplicationFile local:///opt/lakeslot/spark_jobs/<job>.py.
COPY spark_jobs /opt/lakeslot/spark_jobs

RUN useradd --uid 10001 --user-group --no-create-home --home-dir /tmp lakeslot
ENV PYSPARK_PYTHON=python3 PYTHONUNBUFFERED=1
USER 10001
WORKDIR /tmp
# Spark pods start with `driver ...` / `executor ...`; the operator and the reader override the
# command with `lakeslot ...` (the entrypoint passes anything else through).
ENTRYPOINT ["/opt/entrypoint.sh"]
CMD ["lakeslot", "--help"]
