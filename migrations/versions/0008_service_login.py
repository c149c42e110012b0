"""The service role may log in: its connections are then the role itself, not a switch.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-26

0004 made ``contextledger_service`` NOLOGIN, and the service logged in as the DSN's user
(often a superuser) and switched to it with the ``role`` setting. A switched connection
keeps its session user: one ``RESET ROLE`` in a statement (an injection, a bug) and it
reads every tenant, so row-level security stood on the application again. With LOGIN the
service connects as the role (``Tenants.start`` tries it first): nothing to reset to.
LOGIN without a password exposes nothing: where the server asks for passwords, the role
has none until an operator sets one (``ALTER ROLE contextledger_service PASSWORD …``,
then ``CONTEXTLEDGER_SERVICE_PASSWORD``); where it trusts local users, any of them could
log in as the superuser already. A migrating user without the right to alter the role
leaves it as it was (a notice), and the service keeps the switch, with a warning.

The downgrade leaves the role as it is: roles belong to the server, not to this database,
and every database's schema on the server shares this one (0004's downgrade keeps the
role too); taking LOGIN away here would cut off the services of the others.
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ROLE = "contextledger_service"


def upgrade() -> None:
    op.execute(
        f"""
        DO $$
        BEGIN
            IF EXISTS (SELECT FROM pg_roles WHERE rolname = '{ROLE}') THEN
                ALTER ROLE {ROLE} LOGIN;
            END IF;
        EXCEPTION WHEN insufficient_privilege THEN
            RAISE NOTICE 'contextledger: cannot let role {ROLE} log in: %', SQLERRM;
        END
        $$"""
    )


def downgrade() -> None:
    """Nothing: the role is the server's (see above)."""
