"""API keys bound to tenants; cancellation requests.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "api_keys",
        sa.Column("id", sa.Text, primary_key=True),
        sa.Column("tenant_id", sa.Text, nullable=False),
        sa.Column("name", sa.Text, nullable=False, server_default=""),
        # sha256 of the key; the key itself is shown once, when it is created.
        sa.Column("key_hash", sa.Text, nullable=False, unique=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.text("now()")),
        sa.Column("revoked_at", sa.DateTime(timezone=True)),
    )
    op.add_column("responses", sa.Column("cancel_requested_at", sa.DateTime(timezone=True)))
    op.create_index("responses_expires_at", "responses", ["expires_at"],
                    postgresql_where=sa.text("expires_at IS NOT NULL"))


def downgrade() -> None:
    op.drop_index("responses_expires_at", table_name="responses")
    op.drop_column("responses", "cancel_requested_at")
    op.drop_table("api_keys")
