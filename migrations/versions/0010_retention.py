"""When stored responses and conversations expire.

Retention is a number of days, from the most specific of: the request's
``metadata.steno_retention_days`` (a response's, or a conversation's), the tenant's
policy, the default policy (tenant ``*``); with none of them, nothing expires. The
database sets each row's ``expires_at`` as it is stored (triggers), so every writer,
in every replica, applies the same rule, and the sweeper
(``services/api/retention.py``) deletes what has expired, a batch at a time, through
an index.

- A response expires its retention after it was created. A response in a conversation
  lives as long as the conversation (its history must stay whole); when the
  conversation goes, the response's own retention applies from its creation.
- A conversation expires its retention after its last activity: its creation, or the
  creation of its latest response.
- ``store=false`` responses keep the short grace the API and the parser give them.
  A policy change applies to what is stored after it.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

# Days a row is kept, from its own metadata (a string of 1-5 digits, greater than 0, as
# the API requires), its tenant's policy or the default policy; NULL keeps it.
_RETENTION_DAYS = """
CREATE FUNCTION steno_retention_days(tenant text, metadata json) RETURNS integer
LANGUAGE sql STABLE AS $$
    SELECT coalesce(
        CASE WHEN metadata ->> 'steno_retention_days' ~ '^[0-9]{1,5}$'
                  AND (metadata ->> 'steno_retention_days')::int > 0
             THEN (metadata ->> 'steno_retention_days')::int END,
        (SELECT days FROM retention_policies WHERE tenant_id = tenant),
        (SELECT days FROM retention_policies WHERE tenant_id = '*'))
$$
"""

_RESPONSE_EXPIRY = """
CREATE FUNCTION steno_response_expiry() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- An expiry given with the row (an import, say) is kept.
    IF NEW.store AND (TG_OP = 'UPDATE' OR NEW.expires_at IS NULL) THEN
        IF NEW.conversation_id IS NOT NULL AND EXISTS (SELECT 1 FROM conversations WHERE id = NEW.conversation_id) THEN
            NEW.expires_at := NULL;
            UPDATE conversations
            SET expires_at = NEW.created_at + make_interval(days => steno_retention_days(tenant_id, metadata))
            WHERE id = NEW.conversation_id;
        ELSE
            NEW.expires_at := NEW.created_at
                + make_interval(days => steno_retention_days(NEW.tenant_id, NEW.request -> 'metadata'));
        END IF;
    END IF;
    RETURN NEW;
END
$$
"""

# Also when its metadata (and so perhaps its retention) changes.
_CONVERSATION_EXPIRY = """
CREATE FUNCTION steno_conversation_expiry() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.expires_at := greatest(NEW.created_at,
                               (SELECT max(created_at) FROM responses WHERE conversation_id = NEW.id))
        + make_interval(days => steno_retention_days(NEW.tenant_id, NEW.metadata));
    RETURN NEW;
END
$$
"""

# A conversation that goes (deleted or expired) leaves its responses to their own retention.
_CONVERSATION_GONE = """
CREATE FUNCTION steno_conversation_gone() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE responses
    SET expires_at = created_at + make_interval(days => steno_retention_days(tenant_id, request -> 'metadata'))
    WHERE conversation_id = OLD.id AND store;
    RETURN OLD;
END
$$
"""


def upgrade() -> None:
    op.create_table(
        "retention_policies",
        # A tenant, or '*' for every tenant without a policy of its own.
        sa.Column("tenant_id", sa.Text, primary_key=True),
        sa.Column("days", sa.Integer, sa.CheckConstraint("days > 0"), nullable=False),
    )
    op.add_column("conversations", sa.Column("expires_at", sa.DateTime(timezone=True)))
    op.create_index("responses_expiry", "responses", ["expires_at"], postgresql_where=sa.text("expires_at IS NOT NULL"))
    op.create_index("conversations_expiry", "conversations", ["expires_at"],
                    postgresql_where=sa.text("expires_at IS NOT NULL"))
    # The responses of a conversation, for its history and for when it goes.
    op.create_index("responses_conversation", "responses", ["conversation_id"],
                    postgresql_where=sa.text("conversation_id IS NOT NULL"))
    for statement in (_RETENTION_DAYS, _RESPONSE_EXPIRY, _CONVERSATION_EXPIRY, _CONVERSATION_GONE):
        op.execute(statement)
    op.execute("CREATE TRIGGER responses_expiry BEFORE INSERT OR UPDATE OF conversation_id ON responses "
               "FOR EACH ROW EXECUTE FUNCTION steno_response_expiry()")
    op.execute("CREATE TRIGGER conversations_expiry BEFORE INSERT OR UPDATE OF metadata ON conversations "
               "FOR EACH ROW EXECUTE FUNCTION steno_conversation_expiry()")
    op.execute("CREATE TRIGGER conversations_gone AFTER DELETE ON conversations "
               "FOR EACH ROW EXECUTE FUNCTION steno_conversation_gone()")


def downgrade() -> None:
    op.execute("DROP TRIGGER conversations_gone ON conversations")
    op.execute("DROP TRIGGER conversations_expiry ON conversations")
    op.execute("DROP TRIGGER responses_expiry ON responses")
    for function in ("steno_conversation_gone", "steno_conversation_expiry", "steno_response_expiry",
                     "steno_retention_days"):
        op.execute(f"DROP FUNCTION {function}")
    op.drop_index("responses_conversation", table_name="responses")
    op.drop_index("conversations_expiry", table_name="conversations")
    op.drop_index("responses_expiry", table_name="responses")
    op.drop_column("conversations", "expires_at")
    op.drop_table("retention_policies")
