"""Tenant API keys: random, stored as a hash, checked in constant time; anonymous only when allowed."""

from __future__ import annotations

import hashlib

import pytest
from boomerang_gateway import tenants
from boomerang_gateway.tenants import TenantAuth


def test_new_keys_are_random_well_formed_and_hashed() -> None:
    made = [tenants.new_key() for _ in range(50)]
    assert len({m.key for m in made}) == 50 and len({m.key_id for m in made}) == 50
    for m in made:
        assert m.key.startswith("bmr_") and tenants.key_id_of(m.key) == m.key_id
        assert m.key_hash == hashlib.sha256(m.key.encode()).digest() and len(m.key_hash) == 32
        assert tenants.verify(m.key, m.key_hash)
        assert not tenants.verify(m.key[:-1] + ("A" if m.key[-1] != "A" else "B"), m.key_hash)
        assert m.key not in repr(m.key_hash)


def test_key_ids_only_from_well_formed_keys() -> None:
    good = tenants.new_key().key
    for bad in ("", "EMPTY", "bmr_", "bmr_xyz_abc", good + "x", good.upper(), "sk-" + good):
        assert tenants.key_id_of(bad) is None, bad
    assert tenants.looks_like_key(good) and not tenants.looks_like_key("EMPTY")


def test_tenant_names() -> None:
    for ok in ("acme", "team-1", "a.b_c", "x" * 128):
        assert tenants.check_tenant_name(ok) == ok
    for bad in ("", "-lead", "has space", "x" * 129, "ünïcode", "anonymous", "a/b"):
        with pytest.raises(ValueError):
            tenants.check_tenant_name(bad)


async def test_anonymous_only_when_allowed_and_never_for_a_wrong_boomerang_key() -> None:
    strict = TenantAuth(None, allow_anonymous=False, cache_seconds=30)
    assert await strict.tenant_for(None) is None
    assert await strict.tenant_for("Bearer EMPTY") is None
    made = tenants.new_key().key
    assert await strict.tenant_for("Bearer " + made) is None  # no store: cannot verify
    open_ = TenantAuth(None, allow_anonymous=True, cache_seconds=30)
    assert await open_.tenant_for(None) == "anonymous"
    assert await open_.tenant_for("Bearer EMPTY") == "anonymous"  # vLLM clients' placeholder
    assert await open_.tenant_for("Basic abc") == "anonymous"
    assert await open_.tenant_for("Bearer " + made) is None  # claims a key: must verify
