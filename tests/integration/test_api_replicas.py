"""Several API processes on one port: the kernel spreads the connections over them, and
each still answers on a port of its own."""

from __future__ import annotations

import signal
import subprocess
import sys
import urllib.request

import openai
import pytest

from steno.infra.embedded import free_port
from steno.infra.processes import remove_namespace, service_env
from steno.schemas.ids import origin_of
from tests.conftest import separate_stack, steno_up_ready

pytestmark = pytest.mark.integration

# New connections, each handed to one of two processes: all to one is 2 in 2**24.
CONNECTIONS = 24


def origins_through(base_url: str, api_key: str) -> set[str]:
    """The API processes that made responses created on fresh connections to ``base_url``."""
    made = set()
    for i in range(CONNECTIONS):
        with openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0) as client:
            response = client.responses.create(model="steno-simulator", input=f"which process {i}")
            assert response.status == "completed"
            made.add(origin_of(response.id))
    return made


def test_api_processes_on_a_shared_port_each_take_connections(settings, tmp_path):
    shared = free_port()
    with separate_stack(settings, "shared", tmp_path) as stack:
        stack.add("parser", "parser")
        stack.add("worker", "worker", "--sim-tokens-per-s", "2000")
        stack.add_api(shared_port=shared)
        stack.add_api(shared_port=shared)
        base_url = f"http://127.0.0.1:{shared}/v1"
        assert len(origins_through(base_url, stack.keys["a"])) == 2

        # Any process serves any response: one streamed through the shared port is read
        # back through each process's own port, event for event.
        client = openai.OpenAI(base_url=base_url, api_key=stack.keys["a"], max_retries=0)
        events = list(client.responses.create(model="steno-simulator", input="streamed through the shared port",
                                              stream=True))
        assert [event.sequence_number for event in events] == list(range(len(events)))
        response_id = events[0].response.id
        for replica in range(2):
            own = openai.OpenAI(base_url=stack.url_of(replica), api_key=stack.keys["a"], max_retries=0)
            replayed = list(own.responses.retrieve(response_id, stream=True))
            assert [event.model_dump() for event in replayed] == [event.model_dump() for event in events]


def test_a_second_process_cannot_take_a_port_not_shared(settings, tmp_path):
    with separate_stack(settings, "unshared", tmp_path) as stack:
        stack.add_api()
        taken = stack.api_ports[0]
        done = subprocess.run([sys.executable, "-m", "steno.services.cli", "api", "--port", str(free_port()),
                               "--shared-port", str(taken)], env=service_env(stack.settings),
                              capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert f"steno api: cannot listen on 127.0.0.1:{taken}: Address already in use" in done.stderr


def test_steno_up_serves_its_api_replicas_on_one_port(settings, tmp_path):
    port = free_port()
    up_settings = settings.with_changes(namespace=settings.namespace + "up")
    log_path = tmp_path / "up.log"
    with open(log_path, "wb") as log:
        up = subprocess.Popen([sys.executable, "-m", "steno.services.cli", "up", "--data-dir", str(tmp_path / "data"),
                               "--port", str(port), "--api", "2", "--no-auth"],
                              env=service_env(up_settings), stdout=log, stderr=subprocess.STDOUT)
    try:
        text = steno_up_ready(log_path, up)
        assert f"base URL http://127.0.0.1:{port}/v1" in text
        assert f"2 API processes share port {port}; each also listens on its own: " \
               f"api-0 {port + 1}, api-1 {port + 2}" in text
        assert len(origins_through(f"http://127.0.0.1:{port}/v1", "unused")) == 2
        for own in (port + 1, port + 2):
            with urllib.request.urlopen(f"http://127.0.0.1:{own}/health", timeout=5) as health:
                assert health.status == 200
    finally:
        up.send_signal(signal.SIGINT)
        code = up.wait(60)
        remove_namespace(up_settings)
    assert code == 0, log_path.read_text()
