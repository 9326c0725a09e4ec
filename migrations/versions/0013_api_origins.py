"""The API processes of each namespace, by the origin their response ids carry.

An API process records its origin (``schemas/ids.py``) and the deployment's namespace
as it starts. The queue checks (``services/api/queue_checks.py``) look only at
responses made by an origin of their own namespace: a check published for another
deployment's response, on a database two deployments share, would go to a queue that
never held its work, be kept, and fail a live response.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-07
"""

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "api_origins",
        sa.Column("origin", sa.Text, primary_key=True),
        sa.Column("namespace", sa.Text, nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.text("now()")),
    )


def downgrade() -> None:
    op.drop_table("api_origins")
