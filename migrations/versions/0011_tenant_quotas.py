"""Per-tenant quotas: requests per minute, concurrent generations, tokens per minute.

- ``tenant_quotas``: a tenant's limits (NULL: unlimited). The API reads the whole table
  every few seconds, so a tenant without a row costs nothing per request.
- ``quota_windows``: what a tenant with a quota used in each minute (minutes since the
  epoch): requests and prompt tokens counted by the API as it admits a request, output
  tokens added by the database as a response ends (trigger below), so every writer on
  every replica counts alike. Only the current minute is kept; the API prunes the rest.
- ``quota_admissions``: a request admitted whose response row is not stored yet. Running
  generations are the tenant's responses still queued or in progress (derived from their
  status, so nothing leaks when an API replica dies) plus these, so two requests
  admitted at once on two replicas cannot both take the last slot. Counted for a few
  seconds at most (``services/api/quotas.py``).

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

# Output tokens count in the minute the response ended, for tenants with a token quota.
_OUTPUT_TOKENS = """
CREATE FUNCTION steno_quota_output_tokens() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM tenant_quotas WHERE tenant_id = NEW.tenant_id AND tokens_per_minute IS NOT NULL) THEN
        INSERT INTO quota_windows (tenant_id, minute, tokens)
        VALUES (NEW.tenant_id, floor(extract(epoch FROM clock_timestamp()) / 60)::bigint,
                coalesce((NEW.usage ->> 'output_tokens')::bigint, 0))
        ON CONFLICT (tenant_id, minute) DO UPDATE SET tokens = quota_windows.tokens + excluded.tokens;
    END IF;
    RETURN NULL;
END
$$
"""


def upgrade() -> None:
    op.create_table(
        "tenant_quotas",
        sa.Column("tenant_id", sa.Text, primary_key=True),
        sa.Column("requests_per_minute", sa.Integer, sa.CheckConstraint("requests_per_minute > 0")),
        sa.Column("concurrent_generations", sa.Integer, sa.CheckConstraint("concurrent_generations > 0")),
        sa.Column("tokens_per_minute", sa.Integer, sa.CheckConstraint("tokens_per_minute > 0")),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.text("now()")),
    )
    op.create_table(
        "quota_windows",
        sa.Column("tenant_id", sa.Text, primary_key=True),
        sa.Column("minute", sa.BigInteger, primary_key=True),
        sa.Column("requests", sa.Integer, nullable=False, server_default="0"),
        sa.Column("tokens", sa.BigInteger, nullable=False, server_default="0"),
    )
    op.create_table(
        "quota_admissions",
        sa.Column("response_id", sa.Text, primary_key=True),
        sa.Column("tenant_id", sa.Text, nullable=False),
        sa.Column("admitted_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("quota_admissions_tenant", "quota_admissions", ["tenant_id"])
    # A tenant's running generations without reading its whole history.
    op.create_index("responses_running", "responses", ["tenant_id"],
                    postgresql_where=sa.text("status IN ('queued', 'in_progress')"))
    op.execute(_OUTPUT_TOKENS)
    op.execute("CREATE TRIGGER responses_quota_tokens AFTER UPDATE OF status ON responses FOR EACH ROW "
               "WHEN (OLD.status IN ('queued', 'in_progress') AND NEW.status NOT IN ('queued', 'in_progress')) "
               "EXECUTE FUNCTION steno_quota_output_tokens()")


def downgrade() -> None:
    op.execute("DROP TRIGGER responses_quota_tokens ON responses")
    op.execute("DROP FUNCTION steno_quota_output_tokens")
    op.drop_index("responses_running", table_name="responses")
    op.drop_index("quota_admissions_tenant", table_name="quota_admissions")
    op.drop_table("quota_admissions")
    op.drop_table("quota_windows")
    op.drop_table("tenant_quotas")
