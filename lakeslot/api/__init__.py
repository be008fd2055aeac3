"""The PostgresIngestion API: models, CRD generation, offline validation, naming defaults."""
