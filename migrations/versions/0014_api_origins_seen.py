"""When each API process was last seen, so that the origins of processes long gone go.

An API process records its origin as it starts (0013) and, from this revision, marks it
seen on each round of its queue checks. A row unseen for longer than the checks look
back is of a process whose responses they no longer look at, and the checks delete it:
without this the table grew by a row per API process start, for good.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-07
"""

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("api_origins", sa.Column("seen_at", sa.DateTime(timezone=True), nullable=False,
                                           server_default=sa.text("now()")))


def downgrade() -> None:
    op.drop_column("api_origins", "seen_at")
