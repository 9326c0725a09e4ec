"""A response's base snapshot and parse context are kept verbatim (json, not jsonb).

The parser builds a new response's state from the copy of these that rides on the bus,
and rebuilds it from Postgres after a restart; both must give byte-identical events, so
Postgres must hand back the text exactly as written (jsonb reorders object keys).
Rows written before this keep jsonb's order, which is what their events were built from.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29
"""

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE responses ALTER COLUMN base_snapshot TYPE json USING base_snapshot::json,"
               " ALTER COLUMN parse_context TYPE json USING parse_context::json")


def downgrade() -> None:
    op.execute("ALTER TABLE responses ALTER COLUMN base_snapshot TYPE jsonb USING base_snapshot::jsonb,"
               " ALTER COLUMN parse_context TYPE jsonb USING parse_context::jsonb")
