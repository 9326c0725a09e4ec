"""``response_events`` drops its foreign key to ``responses``.

The key's check ran once per inserted event (a trigger and a lookup per row): a quarter
of the time Postgres took to insert a response's events. Integrity holds without it: every statement
that adds events also adds the token batches that produced them (the parser) or the
response row itself (the API), and ``response_tokens`` keeps its key, so events cannot
be written for a response that is gone. Deleting a response deletes its events
explicitly (``ResponseStore``), after the row, in a later statement of the same
transaction, which sees events committed by a parser that held the row meanwhile.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-29
"""

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE response_events DROP CONSTRAINT IF EXISTS response_events_response_id_fkey")


def downgrade() -> None:
    op.execute("DELETE FROM response_events AS e"
               " WHERE NOT EXISTS (SELECT 1 FROM responses AS r WHERE r.id = e.response_id)")
    op.execute("ALTER TABLE response_events ADD CONSTRAINT response_events_response_id_fkey"
               " FOREIGN KEY (response_id) REFERENCES responses (id) ON DELETE CASCADE")
