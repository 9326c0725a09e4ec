"""The fresh-machine path: ``steno up`` with nothing configured, on embedded servers."""

import os
import re
import signal
import subprocess
import sys

import openai
import pytest

from steno.infra.embedded import answers, free_port
from tests.conftest import steno_up_ready

pytestmark = pytest.mark.integration


def test_steno_up_embedded_serves_the_sdk_and_stops_cleanly(tmp_path):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("STENO_")}
    log_path = tmp_path / "up.log"
    with open(log_path, "wb") as log:
        up = subprocess.Popen(
            [sys.executable, "-m", "steno.services.cli", "up", "--embedded", "--data-dir", str(tmp_path / "data"),
             "--port", str(port), "--no-auth"],
            env=env, stdout=log, stderr=subprocess.STDOUT,
        )
    try:
        text = steno_up_ready(log_path, up)
        assert f"base URL http://127.0.0.1:{port}/v1" in text
        nats_port = int(re.search(r"embedded nats-server on 127.0.0.1:(\d+)", text).group(1))
        assert nats_port != 4222
        assert "Postgres postgresql://" in text and str(tmp_path / "data" / "postgres") in text

        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
        response = client.responses.create(model="steno-simulator", input="fresh machine")
        assert response.status == "completed"
        assert response.output_text == "Steno simulator reply: fresh machine"
    finally:
        up.send_signal(signal.SIGINT)
        code = up.wait(60)
    assert code == 0, log_path.read_text()
    assert "stopped" in log_path.read_text()
    assert not answers("127.0.0.1", nats_port)
    assert not answers("127.0.0.1", port)
    postgres = subprocess.run(["pgrep", "-f", str(tmp_path / "data" / "postgres")], capture_output=True,
                              check=False)
    assert postgres.stdout == b""
