"""Conversations: ordered item logs of a tenant, and responses appended to them.

An entry is an item added to the conversation (``item``), an input item of a response
made in it (``response_input``), or a response's output (``response_output``: its items
are read from the response's final snapshot once it has ended, so they are never stored
twice). Deleting an item records its id in ``conversation_deleted_items``; readers leave
it out.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "conversations",
        sa.Column("id", sa.Text, primary_key=True),
        sa.Column("tenant_id", sa.Text, nullable=False),
        sa.Column("metadata", sa.JSON, nullable=False, server_default=sa.text("'{}'::json")),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.text("now()")),
    )
    op.create_index("conversations_tenant_created", "conversations", ["tenant_id", "created_at"])
    op.create_table(
        "conversation_entries",
        sa.Column("conversation_id", sa.Text, sa.ForeignKey("conversations.id", ondelete="CASCADE"),
                  primary_key=True),
        sa.Column("position", sa.Integer, primary_key=True),
        sa.Column("kind", sa.Text, nullable=False),
        sa.Column("response_id", sa.Text),
        sa.Column("item_id", sa.Text),
        # json, not jsonb, as for every column holding a client's text (migration 0005).
        sa.Column("item", sa.JSON),
    )
    op.create_table(
        "conversation_deleted_items",
        sa.Column("conversation_id", sa.Text, sa.ForeignKey("conversations.id", ondelete="CASCADE"),
                  primary_key=True),
        sa.Column("item_id", sa.Text, primary_key=True),
    )


def downgrade() -> None:
    op.drop_table("conversation_deleted_items")
    op.drop_table("conversation_entries")
    op.drop_index("conversations_tenant_created", table_name="conversations")
    op.drop_table("conversations")
