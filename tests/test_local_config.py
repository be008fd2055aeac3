"""Local mode's inputs: the ingestion file, secrets from the environment or an env file (never
argv), the reader's command line, the run lock. No PostgreSQL or Spark needed: bad input must be
refused before anything starts."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lakeslot import workloads
from lakeslot.local import config, reader_process, state
from lakeslot.local.tree import alive
from tests.support.local_support import LAKESLOT
from tests.support.waiting import wait_for

SECRET = "s3cr3t-value-never-printed"


def _document(**source) -> dict:
    return {
        "apiVersion": "lakeslot.io/v1alpha1", "kind": "PostgresIngestion",
        "metadata": {"name": "orders", "namespace": "shop"},
        "spec": {
            "source": {"host": "127.0.0.1", "database": "shop", "user": "lakeslot",
                       "passwordSecretRef": {"name": "pg", "key": "password"},
                       "tables": [{"name": "orders"}], **source},
            "sink": {"catalog": {"type": "hadoop", "warehouse": "file:///tmp/w",
                                 "secretProperties": {"jdbc.password": {"name": "c", "key": "p"}}},
                     "namespace": "shop"},
            "staging": {"uri": "file:///tmp/staging"},
        },
    }


@pytest.fixture
def ingestion_file(tmp_path) -> Path:
    path = tmp_path / "ingestion.yaml"
    path.write_text(yaml.safe_dump(_document()))
    return path


def test_secrets_come_from_the_environment_and_the_env_file(ingestion_file, tmp_path):
    env_file = tmp_path / ".env"
    env_file.write_text("# secrets\n\nexport LAKESLOT_SOURCE_PASSWORD='from-file'\n"
                        'LAKESLOT_CATALOG_JDBC_PASSWORD="catalog secret"\n')
    local = config.load(str(ingestion_file), env_file=str(env_file), environ={})
    assert local.environ[workloads.PASSWORD_ENV] == "from-file"
    assert local.environ["LAKESLOT_CATALOG_JDBC_PASSWORD"] == "catalog secret"
    assert local.job.source(local.environ).password == "from-file"
    # the process environment wins over the file
    local = config.load(str(ingestion_file), env_file=str(env_file),
                        environ={workloads.PASSWORD_ENV: "from-env"})
    assert local.environ[workloads.PASSWORD_ENV] == "from-env"
    assert local.state_dir.parts[-3:] == ("lakeslot", "shop", "orders")


def test_a_missing_secret_names_the_variable_to_set(ingestion_file):
    with pytest.raises(config.ConfigError) as error:
        config.load(str(ingestion_file), environ={})
    message = str(error.value)
    assert "LAKESLOT_SOURCE_PASSWORD" in message and "LAKESLOT_CATALOG_JDBC_PASSWORD" in message
    assert "never from the command line" in message
    document = _document()
    document["spec"]["secretEnv"] = [{"name": "AWS_SECRET_ACCESS_KEY",
                                      "secretKeyRef": {"name": "s3", "key": "secret"}}]
    ingestion_file.write_text(yaml.safe_dump(document))
    environ = {workloads.PASSWORD_ENV: "x", "LAKESLOT_CATALOG_JDBC_PASSWORD": "y"}
    with pytest.raises(config.ConfigError, match=r"AWS_SECRET_ACCESS_KEY \(spec.secretEnv\)"):
        config.load(str(ingestion_file), environ=environ)
    assert config.load(str(ingestion_file), environ={**environ, "AWS_SECRET_ACCESS_KEY": "z"})


def test_a_ca_reference_needs_a_readable_ca_file(tmp_path):
    path = tmp_path / "tls.yaml"
    path.write_text(yaml.safe_dump(_document(sslMode="verify-full",
                                             caSecretRef={"name": "ca", "key": "ca.crt"})))
    environ = {workloads.PASSWORD_ENV: "x", "LAKESLOT_CATALOG_JDBC_PASSWORD": "y"}
    with pytest.raises(config.ConfigError, match="LAKESLOT_SOURCE_CA_FILE"):
        config.load(str(path), environ=environ)
    with pytest.raises(config.ConfigError, match="cannot be read"):
        config.load(str(path), environ={**environ, workloads.CA_FILE_ENV: str(tmp_path / "no")})
    ca = tmp_path / "ca.crt"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    local = config.load(str(path), environ={**environ, workloads.CA_FILE_ENV: str(ca)})
    argv = reader_process.reader_argv(local, pod="p",
                                      status_file=tmp_path / "s.json", stop_at=None)
    assert argv[argv.index("--sslrootcert") + 1] == str(ca)


def test_a_malformed_env_file_line_is_named_without_its_content(ingestion_file, tmp_path):
    env_file = tmp_path / ".env"
    env_file.write_text(f"LAKESLOT_SOURCE_PASSWORD={SECRET}\n{SECRET} oops\n")
    with pytest.raises(config.ConfigError) as error:
        config.load(str(ingestion_file), env_file=str(env_file), environ={})
    assert "line 2" in str(error.value) and SECRET not in str(error.value)


def test_the_file_must_hold_exactly_one_valid_ingestion(tmp_path):
    invalid = tmp_path / "invalid.yaml"
    document = _document()
    document["spec"]["source"]["port"] = 0
    invalid.write_text(yaml.safe_dump(document))
    with pytest.raises(config.ConfigError) as error:
        config.load_ingestion(str(invalid))
    assert "spec.source.port" in str(error.value) and "lakeslot validate" in str(error.value)
    two = tmp_path / "two.yaml"
    two.write_text(yaml.safe_dump_all([_document(), {**_document(), "metadata": {"name": "b"}}]))
    with pytest.raises(config.ConfigError, match="exactly one"):
        config.load_ingestion(str(two))
    with pytest.raises(config.ConfigError, match="cannot read"):
        config.load_ingestion(str(tmp_path / "missing.yaml"))


def test_the_reader_command_line_holds_no_secret_and_no_fixed_port(ingestion_file, tmp_path):
    local = config.load(str(ingestion_file), environ={
        workloads.PASSWORD_ENV: SECRET, "LAKESLOT_CATALOG_JDBC_PASSWORD": SECRET})
    argv = reader_process.reader_argv(local, pod="local-h-1",
                                      status_file=tmp_path / "status.json", stop_at=0x16B3748)
    assert SECRET not in " ".join(argv)
    assert "--metrics-port" not in argv
    assert argv[argv.index("--pod") + 1] == "local-h-1"
    assert argv[argv.index("--stop-at-lsn") + 1] == "0/16B3748"
    assert argv[argv.index("--slot") + 1] == local.job.names.slot


def test_bad_input_exits_2_and_starts_nothing(ingestion_file, tmp_path):
    state_dir = tmp_path / "state"
    for command in ("run", "status"):
        result = subprocess.run([LAKESLOT, command, "-f", str(ingestion_file), "--state-dir",
                                 str(state_dir)], capture_output=True, text=True,
                                env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}, check=False)
        assert result.returncode == 2, result.stderr
        assert "LAKESLOT_SOURCE_PASSWORD" in result.stderr
        assert not state_dir.exists()


def test_one_run_per_ingestion(tmp_path):
    first = state.RunLock(tmp_path)
    first.acquire()
    state.write_run(tmp_path, readerPid=None)
    assert state.run_active(tmp_path)
    with pytest.raises(state.AlreadyRunning, match="another lakeslot run"):
        state.RunLock(tmp_path).acquire()
    first.release()
    assert not state.run_active(tmp_path)
    state.RunLock(tmp_path).acquire()  # free again


def test_a_run_starting_while_status_checks_is_not_refused(tmp_path, monkeypatch):
    """``run_active`` (``lakeslot status``) holds the lock shared for an instant; a run starting
    in that instant waits it out instead of failing with AlreadyRunning (seen in CI, where a
    test polled run_active while its run started). The check here ends while the start waits."""
    fd = os.open(tmp_path / "run.lock", os.O_RDONLY | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_SH)  # a check in progress
    waits: list[float] = []

    def check_ends(seconds: float) -> None:
        if not waits:
            os.close(fd)
        waits.append(seconds)

    monkeypatch.setattr(state.time, "sleep", check_ends)
    state.RunLock(tmp_path).acquire()
    assert waits, "the lock was free at the first try: the check did not overlap the start"
    assert state.run_active(tmp_path)


def test_the_reader_child_dies_with_its_parent(tmp_path):
    """``kill -9`` of the parent: the child (armed with PR_SET_PDEATHSIG) gets SIGTERM."""
    marker = tmp_path / "child.pid"
    child_script = tmp_path / "child.py"
    child_script.write_text(f"import os, time\nopen({str(marker)!r}, 'w').write(str(os.getpid()))"
                            "\ntime.sleep(600)\n")
    parent_script = tmp_path / "parent.py"
    parent_script.write_text(
        "import os, subprocess, sys, time\n"
        "subprocess.Popen([sys.executable, '-m', 'lakeslot.local.deathsig', str(os.getpid()), "
        f"'--', sys.executable, {str(child_script)!r}])\n"
        "time.sleep(600)\n")
    parent = subprocess.Popen([sys.executable, str(parent_script)])
    wait_for(lambda: parent.poll() is not None or (marker.exists() and marker.read_text()),
             "the child to start")
    assert parent.poll() is None
    child = int(marker.read_text())
    assert alive({child})
    parent.kill()
    parent.wait()
    wait_for(lambda: not alive({child}), "the orphaned child to receive SIGTERM and exit")


def test_a_recreated_slots_lsn_survives_the_run_that_found_it(tmp_path):
    assert state.resnapshot_below(tmp_path) == 0  # nothing recorded, nothing written
    assert not (tmp_path / "resnapshot-below").exists()
    assert state.resnapshot_below(tmp_path, 0x16B3748) == 0x16B3748  # found by a run that dies
    assert state.resnapshot_below(tmp_path) == 0x16B3748  # the next run still re-snapshots
    assert state.resnapshot_below(tmp_path, 0x100) == 0x16B3748  # it never moves back
    assert state.resnapshot_below(tmp_path, 0x2000000) == 0x2000000
