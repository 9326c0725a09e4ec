"""Every JSON column that holds request or model text is ``json``, not ``jsonb``.

``jsonb`` refuses the escape ``\\u0000`` (it must turn strings into Postgres text, which
cannot hold a NUL), and a model can emit the byte-0 token: a snapshot, an error or an
input item holding one could not be stored, and the response could never finish.
``json`` keeps the text as written, escape included. Nothing queries into these
columns. ``downgrade`` fails on rows that hold such an escape, as it must.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

COLUMNS = {
    "responses": ("request", "snapshot", "usage", "error"),
    "response_tokens": ("logprobs", "ended"),
    "response_input_items": ("item",),
}


def _alter(kind: str) -> None:
    for table, columns in COLUMNS.items():
        changes = ", ".join(f"ALTER COLUMN {column} TYPE {kind} USING {column}::{kind}" for column in columns)
        op.execute(f"ALTER TABLE {table} {changes}")


def upgrade() -> None:
    _alter("json")


def downgrade() -> None:
    _alter("jsonb")
