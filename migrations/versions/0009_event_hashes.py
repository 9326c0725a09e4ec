"""Every stored event's hash, chained to the previous event of its response
(``schemas/chain.py``), and what a response's first event chained to.

``response_events.hash``: sha256 over the previous event's hash and the payload's UTF-8
bytes, written by the event's writer (the API for what it stores, the parser for the
rest). ``responses.chained_to_*``: the stored event the first event chained to (the last
event of the previous response, or of the conversation's previous turn, when the
response was made) and its hash, so that verification recomputes the first hash even
once that response is gone, and checks the link while it is kept.

Existing rows are not backfilled: a hash written now would vouch for bytes nobody
hashed when they were stored, and rewriting every event of a large log would hold the
table for the migration's length. ``steno audit verify`` re-parses such a response as
ever and says that its events predate hashing; a response that continues one of them
chains from GENESIS and records the link.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Nullable without a default: a change to the catalogue only, whatever the table's size.
    op.add_column("response_events", sa.Column("hash", sa.LargeBinary))
    op.add_column("responses", sa.Column("chained_to_response_id", sa.Text))
    op.add_column("responses", sa.Column("chained_to_seq", sa.Integer))
    op.add_column("responses", sa.Column("chained_to_hash", sa.LargeBinary))


def downgrade() -> None:
    op.drop_column("responses", "chained_to_hash")
    op.drop_column("responses", "chained_to_seq")
    op.drop_column("responses", "chained_to_response_id")
    op.drop_column("response_events", "hash")
