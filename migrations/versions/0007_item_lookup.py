"""Items found by id, for ``item_reference`` input items: an index of each stored
response's output items (the parser writes it as the response ends), and one on input
items' ids. Existing responses' output items are indexed here.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "response_output_items",
        sa.Column("item_id", sa.Text, primary_key=True),
        sa.Column("response_id", sa.Text, sa.ForeignKey("responses.id", ondelete="CASCADE"), nullable=False,
                  index=True),
    )
    op.execute("""
        INSERT INTO response_output_items (item_id, response_id)
        SELECT item->>'id', r.id
        FROM responses AS r, json_array_elements(r.snapshot::json -> 'output') AS item
        WHERE r.snapshot IS NOT NULL AND item->>'id' IS NOT NULL
        ON CONFLICT DO NOTHING
    """)
    op.create_index("response_input_items_item_id", "response_input_items", ["item_id"])


def downgrade() -> None:
    op.drop_index("response_input_items_item_id", table_name="response_input_items")
    op.drop_table("response_output_items")
