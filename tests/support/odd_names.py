"""Identifiers that break naive SQL building: quotes, spaces, upper case, unicode, reserved
words. Every component that names schemas, tables or columns is tested with these."""

from psycopg import sql

from lakeslot.api.naming import TableName

ODD_SCHEMA = 'Sales "EU" 2024'
ODD_TABLES = [
    TableName(ODD_SCHEMA, "order"),
    TableName(ODD_SCHEMA, "Line Items"),
    TableName("public", "ünïcødé_tåble"),
    TableName("public", 'say "hi"'),
    TableName("public", "SELECT"),
]
ODD_COLUMNS = ["id", "user", "Mixed Case", 'qu"ote', "ñ"]


def create_odd_tables(conn) -> list[TableName]:
    """Create ODD_SCHEMA and every ODD_TABLES entry with ODD_COLUMNS (``id`` the primary key)."""
    conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(ODD_SCHEMA)))
    columns = sql.SQL(", ").join(
        sql.SQL("{} int PRIMARY KEY" if c == "id" else "{} text").format(sql.Identifier(c))
        for c in ODD_COLUMNS)
    for table in ODD_TABLES:
        conn.execute(sql.SQL("CREATE TABLE {} ({})").format(table.sql(), columns))
    return list(ODD_TABLES)
