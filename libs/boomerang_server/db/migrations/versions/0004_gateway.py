"""Gateway: tenants and their API keys (stored hashed).

One row per tenant. The API key is `bmr_<key_id>_<secret>`: `key_id` (public, indexed)
finds the row, and `key_hash` — SHA-256 of the whole key — is compared in constant time.
The key has 256 bits of randomness, so a fast hash is enough (no password stretching); the
key itself is printed once by `boomerang tenants create` and never stored.

Revision ID: 0004_gateway
Revises: 0001_registry
Create Date: 2026-11-29
"""

from boomerang_server.db import run_script

revision = "0004_gateway"
down_revision = "0001_registry"

UPGRADE = r"""
CREATE TABLE tenants (
    name text NOT NULL,
    key_id text NOT NULL,
    key_hash bytea NOT NULL,
    created_at timestamptz DEFAULT now() NOT NULL,
    disabled_at timestamptz,
    CONSTRAINT pk_tenants PRIMARY KEY (name),
    CONSTRAINT uq_tenants_key_id UNIQUE (key_id),
    CONSTRAINT ck_tenants_name CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$'),
    CONSTRAINT ck_tenants_key_hash CHECK (length(key_hash) = 32)
);
"""

DOWNGRADE = r"""
DROP TABLE tenants;
"""


def upgrade() -> None:
    run_script(UPGRADE)


def downgrade() -> None:
    run_script(DOWNGRADE)
