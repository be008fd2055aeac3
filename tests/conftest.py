"""Session-wide test fixtures. Each area keeps its fixtures in its own plugin module under
``tests/support`` so that expensive resources (PostgreSQL clusters, the Spark session, the
Kubernetes API emulator) are started once per test session and shared."""

pytest_plugins = [
    "tests.support.fixtures_pg",
    "tests.support.fixtures_spark",
    "tests.support.operator_env",  # the api fixture: emulator client with our CRDs
    "tests.support.fixtures_s3",  # object storage and an Iceberg REST catalog (SeaweedFS)
    "tests.support.fixtures_kube",
]
