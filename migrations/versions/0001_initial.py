"""Responses, their event logs, raw token batches and input items.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

_now = sa.text("now()")


def upgrade() -> None:
    op.create_table(
        "responses",
        sa.Column("id", sa.Text, primary_key=True),
        sa.Column("tenant_id", sa.Text, nullable=False),
        sa.Column("model", sa.Text, nullable=False),
        sa.Column("status", sa.Text, nullable=False),
        sa.Column("background", sa.Boolean, nullable=False),
        sa.Column("store", sa.Boolean, nullable=False),
        sa.Column("previous_response_id", sa.Text),
        sa.Column("conversation_id", sa.Text),
        # The request as accepted (normalised), what the parser needs to interpret the
        # tokens, and the Response object as created (the base of every snapshot).
        sa.Column("request", postgresql.JSONB, nullable=False),
        sa.Column("parse_context", postgresql.JSONB, nullable=False),
        sa.Column("base_snapshot", postgresql.JSONB, nullable=False),
        sa.Column("snapshot", postgresql.JSONB),
        sa.Column("usage", postgresql.JSONB),
        sa.Column("error", postgresql.JSONB),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=_now),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=_now),
        sa.Column("completed_at", sa.DateTime(timezone=True)),
        sa.Column("expires_at", sa.DateTime(timezone=True)),
    )
    op.create_index("responses_tenant_created", "responses", ["tenant_id", "created_at"])
    op.create_table(
        "response_events",
        sa.Column("response_id", sa.Text, sa.ForeignKey("responses.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("seq", sa.Integer, primary_key=True),
        sa.Column("type", sa.Text, nullable=False),
        # The exact JSON sent on the wire, kept as text so replays are byte-identical.
        sa.Column("payload", sa.Text, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=_now),
    )
    op.create_table(
        "response_tokens",
        sa.Column("response_id", sa.Text, sa.ForeignKey("responses.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("attempt", sa.Integer, primary_key=True),
        sa.Column("batch_no", sa.Integer, primary_key=True),
        sa.Column("token_ids", postgresql.ARRAY(sa.Integer), nullable=False),
        sa.Column("logprobs", postgresql.JSONB),
        # Set on the row that records the end of an attempt (GenerationEnded), whose
        # batch_no follows the last token batch.
        sa.Column("ended", postgresql.JSONB),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=_now),
    )
    op.create_table(
        "response_input_items",
        sa.Column("response_id", sa.Text, sa.ForeignKey("responses.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("position", sa.Integer, primary_key=True),
        sa.Column("item_id", sa.Text, nullable=False),
        sa.Column("item", postgresql.JSONB, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("response_input_items")
    op.drop_table("response_tokens")
    op.drop_table("response_events")
    op.drop_index("responses_tenant_created", table_name="responses")
    op.drop_table("responses")
