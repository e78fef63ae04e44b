"""Credentials: hashed bearer tokens of services and engines.

Revision ID: 0005_credentials
Revises: 0001_registry
Create Date: 2026-11-29
"""

from boomerang_server.db import run_script

revision = "0005_credentials"
down_revision = "0001_registry"

UPGRADE = """
CREATE TABLE credentials (
    credential_id bigint GENERATED ALWAYS AS IDENTITY,
    principal text NOT NULL,
    token_sha256 bytea NOT NULL,
    created_at timestamptz DEFAULT now() NOT NULL,
    revoked_at timestamptz,
    CONSTRAINT pk_credentials PRIMARY KEY (credential_id),
    CONSTRAINT uq_credentials_token_sha256 UNIQUE (token_sha256),
    CONSTRAINT ck_credentials_principal CHECK (principal ~ '^(service|engine):.+$')
);
CREATE INDEX ix_credentials_principal ON credentials (principal);
"""


def upgrade() -> None:
    run_script(UPGRADE)


def downgrade() -> None:
    run_script("DROP TABLE credentials")
