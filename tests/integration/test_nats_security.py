"""NATS with authentication and TLS, through the code every Steno service connects with
and through a real ``steno worker`` process: the right settings connect, wrong ones are
refused with an error that names what to fix, and no secret reaches a log.

Each test starts the nats-server binary of the environment with a configuration of its
own, on a free loopback port, with a CA and server certificate made at test time by
``infra/nats-certs.sh`` (openssl), and stops it afterwards."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import hashlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from steno.infra.embedded import answers, free_port, nats_server_binary
from steno.infra.processes import ServiceProcess, service_env
from steno.services.common import bus
from steno.services.common.config import ApiSettings, Settings
from steno.services.common.nats_options import NatsRefused

pytestmark = pytest.mark.integration

CERTS_SCRIPT = Path(__file__).resolve().parents[2] / "infra" / "nats-certs.sh"
PASSWORD = "pw-" + secrets.token_hex(8)
MODEL = "steno-secure"
CONNECT_TIMEOUT_S = 20.0


@dataclasses.dataclass
class NatsServer:
    port: int
    log_path: Path
    process: subprocess.Popen

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@contextmanager
def running_nats(work: Path, body: str, env: dict[str, str] | None = None) -> Iterator[NatsServer]:
    """A nats-server with ``body`` as its configuration (after its listen line)."""
    port = free_port()
    with nats_process(work, f"listen: 127.0.0.1:{port}\n{body}\n", port, env) as server:
        yield server


@contextmanager
def nats_process(work: Path, config_text: str, port: int, env: dict[str, str] | None = None,
                 args: tuple[str, ...] = ()) -> Iterator[NatsServer]:
    """A nats-server with the whole configuration given, listening for clients on ``port``."""
    work.mkdir(parents=True, exist_ok=True)
    config = work / f"nats-{port}.conf"
    config.write_text(config_text)
    log_path = work / f"nats-{port}.log"
    with open(log_path, "ab") as log:
        process = subprocess.Popen([nats_server_binary(), "-c", str(config), *args], stdout=log,
                                   stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
    server = NatsServer(port, log_path, process)
    try:
        deadline = time.monotonic() + 15
        while not answers("127.0.0.1", port):
            assert process.poll() is None, f"nats-server exited:\n{server.log()}"
            assert time.monotonic() < deadline, f"nats-server did not start:\n{server.log()}"
            time.sleep(0.05)
        yield server
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Path:
    """CA, server certificate (localhost, 127.0.0.1) and a client certificate."""
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command")
    out = tmp_path_factory.mktemp("pki")
    subprocess.run(["sh", str(CERTS_SCRIPT), str(out), "localhost", "127.0.0.1"], check=True, capture_output=True,
                   env={**os.environ, "KEEP_CA_KEY": "1"})
    (out / "client.ext").write_text("extendedKeyUsage=clientAuth\n")
    subprocess.run(["openssl", "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-subj", "/CN=steno-client", "-keyout", str(out / "client.key"), "-out", str(out / "client.csr")],
                   check=True, capture_output=True)
    subprocess.run(["openssl", "x509", "-req", "-in", str(out / "client.csr"), "-CA", str(out / "ca.crt"),
                    "-CAkey", str(out / "ca.key"), "-CAcreateserial", "-CAserial", str(out / "ca.srl"), "-days", "1",
                    "-extfile", str(out / "client.ext"), "-out", str(out / "client.crt")],
                   check=True, capture_output=True)
    return out


def tls_block(pki: Path, *, verify_clients: bool = False) -> str:
    return (f'tls {{ cert_file: "{pki / "tls.crt"}", key_file: "{pki / "tls.key"}", ca_file: "{pki / "ca.crt"}", '
            f"timeout: 2{', verify: true' if verify_clients else ''} }}")


@pytest.fixture(scope="module")
def nkey_user(tmp_path_factory) -> tuple[str, Path] | None:
    """An nkey user's public key and seed file, where the nkeys package is installed."""
    try:
        import nkeys
    except ImportError:
        return None
    seed = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER)
    path = tmp_path_factory.mktemp("nkey") / "user.nk"
    path.write_bytes(seed + b"\n")
    return nkeys.from_seed(bytearray(seed)).public_key.decode(), path


@pytest.fixture(scope="module")
def secure_nats(pki, nkey_user, tmp_path_factory) -> Iterator[NatsServer]:
    """JetStream behind TLS and a password (and an nkey user), the way the deployment
    manifests run it: the password comes from the server's environment."""
    work = tmp_path_factory.mktemp("secure-nats")
    users = "{ user: steno, password: $STENO_NATS_PASSWORD }"
    if nkey_user is not None:
        users += f", {{ nkey: {nkey_user[0]} }}"
    body = f'jetstream {{ store_dir: "{work / "js"}" }}\n{tls_block(pki)}\nauthorization {{ users: [ {users} ] }}'
    with running_nats(work, body, {"STENO_NATS_PASSWORD": PASSWORD}) as server:
        yield server


def settings_for(server: NatsServer, pki: Path, **changes) -> ApiSettings:
    good = ApiSettings(
        nats_url=f"tls://localhost:{server.port}", database_url="postgresql://unused/none",
        namespace="sec" + secrets.token_hex(3), token_partitions=2,
        nats_user="steno", nats_password=PASSWORD, nats_tls_ca=str(pki / "ca.crt"),
    )
    return good.with_changes(**changes)


async def connect(settings: Settings):
    return await asyncio.wait_for(bus.connect(settings, "steno-security-test"), CONNECT_TIMEOUT_S)


async def declare_and_check_streams(settings: Settings) -> None:
    nc = await connect(settings)
    try:
        js = nc.jetstream()
        names = bus.Names.from_settings(settings)
        await bus.ensure_streams(js, names)
        assert (await js.stream_info(names.gen_stream)).config.name == names.gen_stream
        await bus.remove_namespace(js, names)
    finally:
        await nc.close()


@pytest.mark.parametrize("where", ["variables", "url"])
async def test_the_right_settings_connect_over_tls_and_declare_the_streams(secure_nats, pki, where):
    if where == "url":
        settings = settings_for(secure_nats, pki, nats_url=f"nats://steno:{PASSWORD}@localhost:{secure_nats.port}",
                                nats_user=None, nats_password=None)
    else:
        settings = settings_for(secure_nats, pki)
    await declare_and_check_streams(settings)


async def test_a_worker_process_with_the_settings_registers_its_model(secure_nats, pki, tmp_path):
    settings = settings_for(secure_nats, pki)
    worker = ServiceProcess("worker", ["worker", "--model", MODEL], tmp_path / "worker.log")
    worker.start(service_env(settings))
    nc = await connect(settings)
    try:
        names = bus.Names.from_settings(settings)
        registry = await bus.worker_registry(nc.jetstream(), names)
        deadline = time.monotonic() + 60
        while True:
            assert worker.exited() is None, worker.log_text()
            try:
                entry = await registry.get(bus.model_token(MODEL))
            except Exception:
                entry = None
            if entry is not None and entry.value:
                break
            assert time.monotonic() < deadline, f"the worker never registered:\n{worker.log_text()}"
            await asyncio.sleep(0.2)
        assert MODEL in entry.value.decode()
    finally:
        assert worker.stop(signal.SIGTERM) == 0, worker.log_text()
        await bus.remove_namespace(nc.jetstream(), bus.Names.from_settings(settings))
        await nc.close()
    assert PASSWORD not in worker.log_text()


async def test_a_wrong_password_is_refused_naming_what_to_check(secure_nats, pki):
    with pytest.raises(NatsRefused, match=r"refused the credentials .*STENO_NATS_PASSWORD"):
        await connect(settings_for(secure_nats, pki, nats_password="not-the-password"))


@pytest.mark.parametrize("scheme", ["tls", "nats"])
async def test_without_the_ca_the_server_certificate_is_refused(secure_nats, pki, scheme):
    # nats://: TLS was not asked for, but the server requires it; either way the system's
    # CAs do not know this server's.
    settings = settings_for(secure_nats, pki, nats_url=f"{scheme}://localhost:{secure_nats.port}", nats_tls_ca=None)
    with pytest.raises(NatsRefused, match=r"cannot be verified .*set STENO_NATS_TLS_CA"):
        await connect(settings)


async def test_a_server_whose_certificate_names_another_host_is_refused(pki, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    subprocess.run(["sh", str(CERTS_SCRIPT), str(elsewhere), "nats.elsewhere.example"], check=True,
                   capture_output=True)
    body = (f'tls {{ cert_file: "{elsewhere / "tls.crt"}", key_file: "{elsewhere / "tls.key"}" }}\n'
            f"authorization {{ users: [ {{ user: steno, password: {PASSWORD} }} ] }}")
    with running_nats(tmp_path, body) as server:
        settings = settings_for(server, pki, nats_tls_ca=str(elsewhere / "ca.crt"))
        with pytest.raises(NatsRefused, match=r"cannot be verified .*Hostname mismatch"):
            await connect(settings)


def test_a_worker_with_a_wrong_password_exits_with_one_line_and_no_secret(secure_nats, pki, tmp_path):
    wrong = "wrong-" + secrets.token_hex(6)
    worker = ServiceProcess("worker", ["worker", "--model", MODEL], tmp_path / "worker.log")
    worker.start(service_env(settings_for(secure_nats, pki, nats_password=wrong)))
    assert worker.process is not None
    assert worker.process.wait(60) == 2, worker.log_text()
    log = worker.log_text()
    assert "steno worker: NATS server tls://localhost" in log and "refused the credentials" in log
    assert "Traceback" not in log
    assert wrong not in log and PASSWORD not in log


def test_a_missing_ca_file_stops_a_service_at_start_naming_the_variable(secure_nats, pki, tmp_path):
    env = service_env(settings_for(secure_nats, pki))
    env["STENO_NATS_TLS_CA"] = str(tmp_path / "no-such-ca.crt")
    done = subprocess.run([sys.executable, "-m", "steno.services.cli", "worker"], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2
    assert f"STENO_NATS_TLS_CA: no such file: {tmp_path / 'no-such-ca.crt'}" in done.stderr


async def test_with_tls_configured_a_server_without_tls_never_gets_the_password(pki, tmp_path):
    body = "authorization { users: [ { user: steno, password: $STENO_NATS_PASSWORD } ] }"
    with running_nats(tmp_path, body, {"STENO_NATS_PASSWORD": PASSWORD}) as plain:
        settings = settings_for(plain, pki, nats_url=f"nats://localhost:{plain.port}")
        with pytest.raises(NatsRefused, match="does not require TLS, but TLS is configured"):
            await connect(settings)
        # Without TLS asked for, the same server takes the same credentials.
        nc = await connect(settings.with_changes(nats_tls_ca=None))
        await nc.close()


async def test_mutual_tls_needs_the_client_certificate(pki, tmp_path):
    users = f"authorization {{ users: [ {{ user: steno, password: {PASSWORD} }} ] }}"
    body = f"{tls_block(pki, verify_clients=True)}\n{users}"
    with running_nats(tmp_path, body) as server:
        without = settings_for(server, pki)
        with pytest.raises(NatsRefused, match=r"TLS with NATS server .* failed .*STENO_NATS_TLS_CERT"):
            await connect(without)
        nc = await connect(without.with_changes(nats_tls_cert=str(pki / "client.crt"),
                                               nats_tls_key=str(pki / "client.key")))
        await nc.close()


async def test_an_nkey_seed_file_authenticates(secure_nats, pki, nkey_user, tmp_path):
    if nkey_user is None:
        pytest.skip("needs the nkeys package")
    import nkeys

    by_seed = settings_for(secure_nats, pki, nats_user=None, nats_password=None, nats_nkey_seed=str(nkey_user[1]))
    await declare_and_check_streams(by_seed)
    stranger = tmp_path / "stranger.nk"
    stranger.write_bytes(nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER))
    with pytest.raises(NatsRefused, match="refused the credentials"):
        await connect(by_seed.with_changes(nats_nkey_seed=str(stranger)))


def _jwt(signer, subject: str, name: str, claims: dict) -> str:
    """A NATS JWT (ed25519-nkey), as nsc writes them."""

    def b64(raw: bytes) -> str:
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    body = {"iat": int(time.time()), "iss": signer.public_key.decode(), "name": name, "sub": subject, "nats": claims}
    body["jti"] = base64.b32encode(hashlib.sha256(json.dumps(body, sort_keys=True).encode()).digest()).decode()
    signed = f"{b64(json.dumps({'typ': 'JWT', 'alg': 'ed25519-nkey'}).encode())}.{b64(json.dumps(body).encode())}"
    return f"{signed}.{b64(signer.sign(signed.encode()))}"


async def test_a_creds_file_authenticates_against_an_operator_configured_server(tmp_path):
    nkeys = pytest.importorskip("nkeys")

    def keypair(prefix: int):
        return nkeys.from_seed(bytearray(nkeys.encode_seed(os.urandom(32), prefix)))

    operator, account, user = (keypair(p) for p in (nkeys.PREFIX_BYTE_OPERATOR, nkeys.PREFIX_BYTE_ACCOUNT,
                                                     nkeys.PREFIX_BYTE_USER))
    account_id = account.public_key.decode()
    unlimited = {"subs": -1, "data": -1, "payload": -1}
    operator_jwt = _jwt(operator, operator.public_key.decode(), "op", {"type": "operator", "version": 2})
    account_jwt = _jwt(operator, account_id, "steno", {
        "type": "account", "version": 2,
        "limits": {**unlimited, "imports": -1, "exports": -1, "wildcards": True, "conn": -1, "leaf": -1}})
    user_jwt = _jwt(account, user.public_key.decode(), "steno", {"type": "user", "version": 2, "pub": {}, "sub": {},
                                                                  **unlimited})
    creds = tmp_path / "steno.creds"
    creds.write_text(f"-----BEGIN NATS USER JWT-----\n{user_jwt}\n------END NATS USER JWT------\n\n"
                     f"-----BEGIN USER NKEY SEED-----\n{user.seed.decode()}\n------END USER NKEY SEED------\n")
    body = f"operator: {operator_jwt}\nresolver: MEMORY\nresolver_preload: {{ {account_id}: {account_jwt} }}"
    with running_nats(tmp_path, body) as server:
        settings = Settings(nats_url=f"nats://127.0.0.1:{server.port}", database_url="postgresql://unused/none",
                            namespace="creds", token_partitions=1, nats_creds=str(creds))
        nc = await connect(settings)
        try:
            inbox = await nc.subscribe("steno.check")
            await nc.publish("steno.check", b"over creds")
            assert (await inbox.next_msg(5)).data == b"over creds"
        finally:
            await nc.close()
        with pytest.raises(NatsRefused, match="refused the credentials"):
            await connect(settings.with_changes(nats_creds=None))


# The deployment manifests' NATS configurations, run for real: the same text with the
# container paths and host names swapped for this machine's.
INFRA = Path(__file__).resolve().parents[2] / "infra"


def on_this_machine(config: str, tls_dir: Path, work: Path, ports: dict[str, int]) -> str:
    config = config.replace("/etc/nats-tls", str(tls_dir)).replace("store_dir: /data", f'store_dir: "{work}"')
    config = config.replace("/var/run/nats/nats.pid", str(work / "nats.pid"))
    for old, new in ports.items():
        config = config.replace(old, f"127.0.0.1:{new}")
    return config


def test_the_kubernetes_nats_config_is_valid_and_needs_the_password(tmp_path):
    import yaml

    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command")
    subprocess.run(["sh", str(CERTS_SCRIPT), str(tmp_path / "tls"), "nats-0.nats", "nats-1.nats", "nats-2.nats"],
                   check=True, capture_output=True)
    config_map = next(yaml.safe_load_all((INFRA / "k8s" / "nats.yaml").read_text()))
    config = tmp_path / "nats.conf"
    config.write_text(on_this_machine(config_map["data"]["nats.conf"], tmp_path / "tls", tmp_path, {}))
    env = {**os.environ, "POD_NAME": "nats-0"}
    checked = subprocess.run([nats_server_binary(), "-c", str(config), "-t"], capture_output=True, text=True,
                             env={**env, "STENO_NATS_PASSWORD": PASSWORD})
    assert checked.returncode == 0, checked.stderr
    unset = subprocess.run([nats_server_binary(), "-c", str(config), "-t"], capture_output=True, text=True, env=env)
    assert unset.returncode != 0 and "STENO_NATS_PASSWORD" in unset.stderr


async def test_the_compose_nats_config_forms_a_cluster_that_steno_reaches_over_tls(tmp_path):
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command")
    tls_dir = tmp_path / "tls"
    subprocess.run(["sh", str(CERTS_SCRIPT), str(tls_dir), "nats-1", "nats-2", "nats-3", "localhost", "127.0.0.1"],
                   check=True, capture_output=True)
    clients, routes = [free_port() for _ in range(3)], [free_port() for _ in range(3)]
    env = {"STENO_NATS_PASSWORD": PASSWORD}
    with contextlib.ExitStack() as nodes:
        for i in range(3):
            ports = {"0.0.0.0:4222": clients[i], "0.0.0.0:6222": routes[i], "0.0.0.0:8222": free_port(),
                     **{f"nats-{n + 1}:6222": routes[n] for n in range(3)}}
            config = on_this_machine((INFRA / "nats-compose.conf").read_text(), tls_dir, tmp_path / f"node-{i}",
                                     ports)
            nodes.enter_context(nats_process(tmp_path / f"node-{i}", config, clients[i], env,
                                             ("--server_name", f"nats-{i + 1}")))
        settings = Settings(nats_url=",".join(f"tls://localhost:{port}" for port in clients),
                            database_url="postgresql://unused/none", namespace="cluster", token_partitions=2,
                            stream_replicas=3, nats_user="steno", nats_password=PASSWORD,
                            nats_tls_ca=str(tls_dir / "ca.crt"))
        nc = await connect(settings)
        try:
            js, names = nc.jetstream(), bus.Names.from_settings(settings)
            deadline = time.monotonic() + 60
            while True:  # JetStream elects its meta leader over the (TLS) routes first
                try:
                    await bus.ensure_streams(js, names)
                    break
                except Exception:
                    assert time.monotonic() < deadline, "the cluster never formed"
                    await asyncio.sleep(0.5)
            info = await js.stream_info(names.tokens_stream)
            assert info.config.num_replicas == 3 and len(info.cluster.replicas or []) == 2
        finally:
            await nc.close()
