"""Keys that seal reasoning for stateless clients (``services/common/reasoning_keys.py``).

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "reasoning_keys",
        sa.Column("id", sa.Text, primary_key=True),
        sa.Column("secret", sa.LargeBinary, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.text("now()")),
        # Blobs sealed with a retired key no longer open.
        sa.Column("retired_at", sa.DateTime(timezone=True)),
    )


def downgrade() -> None:
    op.drop_table("reasoning_keys")
