"""Forks through the service (``POST /v1/sessions/{id}/fork``) and the command line."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from contextledger.http.settings import Settings
from tests.integration.service_support import Running, running_service
from tests.integration.test_cli import run, seed


@pytest_asyncio.fixture
async def svc(pg_dsn: str) -> AsyncIterator[Running]:
    async with running_service(Settings(dsn=pg_dsn, migrate=False)) as running:
        yield running


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


async def test_fork_over_http(svc: Running) -> None:
    c = svc.client
    await c.post("/v1/sessions", json={"session_id": "s", "metadata": {"team": "a"}})
    for i in range(3):
        await c.post("/v1/sessions/s/messages", json={"message": user(f"turn {i}")})
    await c.post("/v1/sessions/s/checkpoints", json={"label": "mid"})
    await c.post("/v1/sessions/s/messages", json={"message": user("after mid")})
    made = await c.post("/v1/sessions/s/fork", json={"session_id": "s fork é"})
    assert made.status_code == 201, made.text
    body = made.json()
    assert made.headers["location"] == "/v1/sessions/s%20fork%20%C3%A9"
    assert body["parent"] == {"session_id": "s", "seq": 6} and body["head"] == 7
    assert body["metadata"] == {"team": "a"}
    parent_view = (await c.get("/v1/sessions/s/view")).json()["messages"]
    fork_view = (await c.get("/v1/sessions/s fork é/view")).json()["messages"]
    assert fork_view == parent_view
    at_mid = await c.post(
        "/v1/sessions/s/fork", json={"session_id": "s2", "at": "mid", "metadata": {"x": 1}}
    )
    assert at_mid.status_code == 201 and at_mid.json()["parent"] == {"session_id": "s", "seq": 5}
    assert at_mid.json()["metadata"] == {"x": 1}
    view = (await c.get("/v1/sessions/s2/view")).json()["messages"]
    assert view == (await c.get("/v1/sessions/s/view", params={"at": 5})).json()["messages"]
    assert (await c.get("/v1/sessions/s2/verify")).json()["ok"] is True
    at_seq = await c.post("/v1/sessions/s/fork", json={"session_id": "s3", "at": 2})
    assert at_seq.json()["parent"] == {"session_id": "s", "seq": 2}
    # refused, nothing written
    for payload, status, code in [
        ({"session_id": "s2"}, 409, "SESSION_EXISTS"),
        ({"session_id": "s4", "at": "never"}, 404, "CHECKPOINT_NOT_FOUND"),
        ({"session_id": "s4", "at": 99}, 422, "INVALID_ARGUMENT"),
        ({"session_id": "s4", "at": -1}, 422, "INVALID_ARGUMENT"),
        ({"session_id": "s4", "at": True}, 422, None),  # not seq 1
        ({"session_id": "s4", "at": 2.0}, 422, None),
        ({"session_id": "a/b"}, 422, None),
        ({"session_id": "s4", "copy": True}, 422, None),
        ({"session_id": "s4", "metadata": "x"}, 422, None),
    ]:
        r = await c.post("/v1/sessions/s/fork", json=payload)
        assert r.status_code == status, (payload, r.text)
        if code is not None:
            assert r.json()["code"] == code
    assert (await c.get("/v1/sessions/s4")).status_code == 404
    nobody = await c.post("/v1/sessions/nobody/fork", json={"session_id": "s4"})
    assert nobody.status_code == 404 and nobody.json()["code"] == "SESSION_NOT_FOUND"
    # a parent with forks is not purged: the error names them
    refused = await c.delete("/v1/sessions/s", params={"reason": "test"})
    assert refused.status_code == 409 and refused.json()["code"] == "SESSION_HAS_FORKS"
    assert "s2" in refused.text and (await c.get("/v1/sessions/s")).status_code == 200


def test_fork_on_the_command_line(pg_dsn: str) -> None:
    seed(pg_dsn)
    made = run(pg_dsn, "fork", "cli", "cli-2", "--at", "mid", "--json")
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout) == {"session_id": "cli-2", "head": 5, "parent": ["cli", 4]}
    view = run(pg_dsn, "view", "cli-2", "--json")
    assert [m["content"] for m in json.loads(view.stdout)] == ["first question", "first answer"]
    at_head = run(pg_dsn, "fork", "cli", "cli-3")
    assert at_head.returncode == 0 and "at seq 5" in at_head.stdout
    assert run(pg_dsn, "verify", "cli-3").returncode == 0
    taken = run(pg_dsn, "fork", "cli", "cli-2")
    assert taken.returncode != 0 and "SESSION_EXISTS" in taken.stdout + taken.stderr


async def test_a_tenant_forks_and_erases_only_its_own(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two tenants with the same ids: one cannot fork or erase the other's session (404,
    nothing written), and an erasure's cascade follows the erasing tenant's forks only."""
    from tests.integration.service_support import new_key

    monkeypatch.setenv("CONTEXTLEDGER_KEK", base64.b64encode(bytes(range(32))).decode())
    keys = {t: await new_key(pg_dsn, t) for t in ("alpha", "beta")}
    h = {t: {"Authorization": f"Bearer {k}"} for t, k in keys.items()}
    async with running_service(Settings(dsn=pg_dsn, migrate=False)) as running:
        c = running.client
        for tenant in ("alpha", "beta"):
            await c.post("/v1/sessions", json={"session_id": "s"}, headers=h[tenant])
            await c.post(
                "/v1/sessions/s/messages",
                json={"message": user(f"{tenant} says")},
                headers=h[tenant],
            )
            made = await c.post(
                "/v1/sessions/s/fork", json={"session_id": "s-f"}, headers=h[tenant]
            )
            assert made.status_code == 201, made.text
        await c.post("/v1/sessions", json={"session_id": "alpha-only"}, headers=h["alpha"])
        stolen = await c.post(
            "/v1/sessions/alpha-only/fork", json={"session_id": "mine"}, headers=h["beta"]
        )
        assert stolen.status_code == 404 and stolen.json()["code"] == "SESSION_NOT_FOUND"
        assert (await c.get("/v1/sessions/mine", headers=h["beta"])).status_code == 404
        gone = await c.delete(
            "/v1/sessions/alpha-only", params={"reason": "r", "erase": "true"}, headers=h["beta"]
        )
        assert gone.status_code == 404
        assert (await c.get("/v1/sessions/alpha-only", headers=h["alpha"])).status_code == 200

        erased = await c.delete(
            "/v1/sessions/s", params={"reason": "asked", "erase": "true"}, headers=h["alpha"]
        )
        assert erased.status_code == 200, erased.text
        assert [e["session_id"] for e in erased.json()["erased"]] == ["s", "s-f"]
        assert (await c.get("/v1/sessions/s-f", headers=h["alpha"])).status_code == 410
        for sid in ("s", "s-f"):
            got = await c.get(f"/v1/sessions/{sid}/messages", headers=h["beta"])
            assert got.status_code == 200
            assert got.json()["messages"] == [user("beta says")]
