"""An ended response's events compacted into one row.

While a response runs and for a while after it ends, each event is a row of
``response_events`` (what live tails and a late duplicate write meet). After that the
API's sweeper moves them into ``response_event_chunks``: one row per move holding the
events' types, payloads, hashes and times as arrays, in ``seq`` order from
``first_seq``. A row that large is compressed by Postgres as it is stored (TOAST), and
one row with one index entry replaces a row, a tuple header, a response id and an index
entry per event. Payloads are kept as the exact text sent, so a replay stays
byte-identical.

- ``response_log``: every event of every response from both places, as one log; every
  reader of events reads it.
- ``responses.events_compacted``: whether the sweeper has moved the response's events;
  the partial index finds the ended responses still to move without a scan.
- ``responses_expires_at`` (0002) goes: ``responses_expiry`` (0010) is the same index,
  and every response stored paid for both.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

_LOG = """
CREATE VIEW response_log AS
SELECT response_id, seq, type, payload, hash, created_at FROM response_events
UNION ALL
SELECT c.response_id, c.first_seq + e.position::int - 1, e.type, e.payload, e.hash, e.created_at
FROM response_event_chunks AS c,
     unnest(c.types, c.payloads, c.hashes, c.created_ats)
         WITH ORDINALITY AS e(type, payload, hash, created_at, position)
"""


def upgrade() -> None:
    op.create_table(
        "response_event_chunks",
        sa.Column("response_id", sa.Text, primary_key=True),
        sa.Column("first_seq", sa.Integer, primary_key=True),
        sa.Column("types", sa.ARRAY(sa.Text), nullable=False),
        sa.Column("payloads", sa.ARRAY(sa.Text), nullable=False),
        sa.Column("hashes", sa.ARRAY(sa.LargeBinary), nullable=False),
        sa.Column("created_ats", sa.ARRAY(sa.DateTime(timezone=True)), nullable=False),
    )
    op.execute(_LOG)
    op.add_column("responses", sa.Column("events_compacted", sa.Boolean, nullable=False,
                                         server_default=sa.false()))
    op.create_index("responses_to_compact", "responses", ["completed_at"],
                    postgresql_where=sa.text("completed_at IS NOT NULL AND NOT events_compacted"))
    op.drop_index("responses_expires_at", table_name="responses")


def downgrade() -> None:
    op.create_index("responses_expires_at", "responses", ["expires_at"],
                    postgresql_where=sa.text("expires_at IS NOT NULL"))
    op.execute("INSERT INTO response_events (response_id, seq, type, payload, hash, created_at)"
               " SELECT response_id, seq, type, payload, hash, created_at FROM response_log AS l"
               " WHERE EXISTS (SELECT 1 FROM response_event_chunks AS c WHERE c.response_id = l.response_id)"
               " ON CONFLICT DO NOTHING")
    op.drop_index("responses_to_compact", table_name="responses")
    op.drop_column("responses", "events_compacted")
    op.execute("DROP VIEW response_log")
    op.drop_table("response_event_chunks")
