"""Keys and tenants: another tenant's response is a 404 on every route."""

import contextlib
import subprocess
import sys
import time

import httpx
import openai
import pytest

from steno.infra.processes import service_env
from tests.conftest import SLOW_MODEL

pytestmark = pytest.mark.integration

MODEL = "steno-simulator"


@pytest.fixture(scope="module")
def owned(stack):
    """A finished and a running background response of tenant "a"."""
    client = openai.OpenAI(base_url=stack.base_url, api_key=stack.keys["a"], max_retries=0)
    finished = client.responses.create(model=MODEL, input="mine")
    running = client.responses.create(model=SLOW_MODEL, input="mine, still running " * 10, background=True)
    yield finished, running
    with contextlib.suppress(openai.BadRequestError):
        client.responses.cancel(running.id)


ROUTES = [
    ("GET", "/responses/{id}", None),
    ("GET", "/responses/{id}?stream=true", None),
    ("GET", "/responses/{id}?stream=true&starting_after=0", None),
    ("GET", "/responses/{id}/input_items", None),
    ("POST", "/responses/{id}/cancel", None),
    ("DELETE", "/responses/{id}", None),
]


@pytest.mark.parametrize(("method", "path", "body"), ROUTES)
@pytest.mark.parametrize("which", ["finished", "running"])
def test_other_tenant_gets_404_on_every_route(stack, owned, method, path, body, which):
    target = owned[0] if which == "finished" else owned[1]
    url = stack.base_url + path.format(id=target.id)
    theirs = httpx.request(method, url, headers=stack.headers("b"), json=body, timeout=10)
    missing = httpx.request(method, stack.base_url + path.format(id="resp_" + "0" * 48), headers=stack.headers("b"),
                            json=body, timeout=10)
    assert theirs.status_code == 404
    assert theirs.json()["error"]["param"] == missing.json()["error"]["param"]
    assert theirs.json()["error"]["message"].replace(target.id, "ID") == \
        missing.json()["error"]["message"].replace("resp_" + "0" * 48, "ID")
    # The owner still has it.
    reply = httpx.get(f"{stack.base_url}/responses/{target.id}", headers=stack.headers("a"), timeout=10)
    assert reply.status_code == 200


def test_other_tenant_cannot_chain_from_it(stack, owned, other_tenant):
    with pytest.raises(openai.BadRequestError) as info:
        other_tenant.responses.create(model=MODEL, input="x", previous_response_id=owned[0].id)
    assert info.value.code == "previous_response_not_found"


def test_missing_and_wrong_keys_are_401(stack):
    body = {"model": MODEL, "input": "x"}
    none = httpx.post(f"{stack.base_url}/responses", json=body, timeout=10)
    wrong = httpx.post(f"{stack.base_url}/responses", json=body, headers={"Authorization": "Bearer sk-nope"},
                       timeout=10)
    for reply in (none, wrong):
        assert reply.status_code == 401
        assert set(reply.json()["error"]) == {"message", "type", "param", "code"}
    assert wrong.json()["error"]["code"] == "invalid_api_key"


def test_revoked_key_stops_working(stack):
    key = stack.create_key("c")
    client = openai.OpenAI(base_url=stack.base_url, api_key=key, max_retries=0)
    assert client.responses.create(model=MODEL, input="x").status == "completed"
    listed = subprocess.run([sys.executable, "-m", "steno.services.cli", "keys", "list"],
                            env=service_env(stack.settings), capture_output=True, text=True, check=True).stdout
    key_id = next(line.split()[0] for line in listed.splitlines() if "tenant=c " in line)
    assert key not in listed  # keys are stored hashed and never listed
    subprocess.run([sys.executable, "-m", "steno.services.cli", "keys", "revoke", key_id],
                   env=service_env(stack.settings), check=True, capture_output=True)
    deadline = time.monotonic() + 15
    while True:
        try:
            client.responses.create(model=MODEL, input="x")
        except openai.AuthenticationError:
            break
        assert time.monotonic() < deadline, "a revoked key still works"
        time.sleep(0.5)
