"""``JobConfig.tls`` from the environment (``REFLOW_TLS_CERT_FILE`` / ``_KEY_FILE`` /
``_CA_FILE``, as deploy/k8s sets them): the default it gives, that a value given to
``JobConfig`` wins, the ``ConfigError`` naming the variable when a file is missing, and that
the pair docs/guide/deployment.md tells users to make with openssl loads and handshakes.
(That a job with the variables set runs over TLS on Ray: tests/integration/test_tls_env_on_ray.py.)"""

from __future__ import annotations

import dataclasses
import re
import socket
import subprocess
import threading
from pathlib import Path

import pytest

from engine import JobConfig
from engine.dataflow.config import TLS_ENV, tls_from_env
from engine.errors import ConfigError, ReflowError
from engine.wire.transport import TLS, tls_contexts
from tests.system import require
from tests.tls import self_signed

ROOT = Path(__file__).resolve().parents[2]
CERT, KEY, CA = TLS_ENV


@pytest.fixture(autouse=True)
def _no_tls_variables(monkeypatch):
    """Each test starts without the variables, whatever the shell running it set."""
    for name in TLS_ENV:
        monkeypatch.delenv(name, raising=False)


def _set(monkeypatch, tls: TLS, ca: str | None = None) -> None:
    monkeypatch.setenv(CERT, tls.cert_file)
    monkeypatch.setenv(KEY, tls.key_file)
    if ca is not None:
        monkeypatch.setenv(CA, ca)


def test_without_the_variables_there_is_no_tls():
    assert tls_from_env() is None
    assert JobConfig().tls is None


def test_the_variables_give_the_default(monkeypatch, tmp_path):
    pair = self_signed(tmp_path)
    _set(monkeypatch, pair)
    assert JobConfig().tls == TLS(pair.cert_file, pair.key_file)
    assert JobConfig().tls.ca == pair.cert_file  # its own CA
    other = self_signed(tmp_path / "ca", "ca")
    monkeypatch.setenv(CA, other.cert_file)
    assert JobConfig().tls == TLS(pair.cert_file, pair.key_file, other.cert_file)
    # the contexts load from them (the task actors build these)
    tls_contexts(JobConfig().tls)


def test_a_value_given_to_jobconfig_wins(monkeypatch, tmp_path):
    pair, mine = self_signed(tmp_path / "env"), self_signed(tmp_path / "mine", "mine")
    _set(monkeypatch, pair)
    assert JobConfig(tls=None).tls is None
    assert JobConfig(tls=mine).tls == mine
    # the variables are not even read then: a missing file does not fail a job that chose
    monkeypatch.setenv(CERT, str(tmp_path / "gone.crt"))
    assert JobConfig(tls=mine).tls == mine
    assert JobConfig(tls=None).tls is None
    # a copy keeps the value it copies
    cfg = JobConfig(tls=mine)
    assert dataclasses.replace(cfg, batch_size=7).tls == mine


@pytest.mark.parametrize("name", TLS_ENV)
def test_a_variable_naming_no_file_is_a_config_error_naming_it(monkeypatch, tmp_path, name):
    pair = self_signed(tmp_path)
    _set(monkeypatch, pair, ca=pair.cert_file)
    missing = str(tmp_path / "mnt" / "absent.pem")
    monkeypatch.setenv(name, missing)
    with pytest.raises(ConfigError) as info:
        JobConfig()
    msg = str(info.value)
    assert isinstance(info.value, ReflowError)
    assert msg.startswith(f"JobConfig: {name}={missing!r} names no file on this node"), msg
    assert "Secret mounted" in msg and "unset the REFLOW_TLS_* variables" in msg


def test_a_directory_is_not_a_file(monkeypatch, tmp_path):
    pair = self_signed(tmp_path)
    _set(monkeypatch, pair)
    monkeypatch.setenv(KEY, str(tmp_path))
    with pytest.raises(ConfigError, match=f"^JobConfig: {KEY}="):
        JobConfig()


@pytest.mark.parametrize("only", [CERT, KEY, CA])
def test_half_a_pair_is_refused_naming_what_is_missing(monkeypatch, tmp_path, only):
    pair = self_signed(tmp_path)
    monkeypatch.setenv(only, pair.cert_file)
    missing = [n for n in (CERT, KEY) if n != only]
    with pytest.raises(ConfigError) as info:
        JobConfig()
    msg = str(info.value)
    assert msg.startswith(f"JobConfig: tls from the environment needs both {CERT} and {KEY}")
    assert f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not set" in msg, msg


def test_blank_variables_count_as_unset(monkeypatch):
    for name in TLS_ENV:
        monkeypatch.setenv(name, "  ")
    assert JobConfig().tls is None


def test_the_ray_transport_ignores_the_variables_but_not_a_given_tls(monkeypatch, tmp_path):
    pair, mine = self_signed(tmp_path / "env"), self_signed(tmp_path / "mine", "mine")
    _set(monkeypatch, pair)
    assert JobConfig(transport="ray").tls is None
    assert dataclasses.replace(JobConfig(), transport="ray").tls is None
    assert JobConfig(transport="tcp").tls == TLS(pair.cert_file, pair.key_file)
    with pytest.raises(ConfigError, match="JobConfig: tls must be None with transport='ray'"):
        JobConfig(transport="ray", tls=mine)


def _documented_openssl() -> str:
    """The openssl command docs/guide/deployment.md gives (continuation lines joined)."""
    text = (ROOT / "docs" / "guide" / "deployment.md").read_text().replace("\\\n", " ")
    found = re.findall(r"^openssl req -x509 .*$", text, re.M)
    assert len(found) == 1, found
    return found[0]


def _handshake(server: object, client: object) -> tuple[str, bytes]:
    """One TLS handshake over a socket pair: (the client's TLS version, the certificate
    the server presented, DER)."""
    a, b = socket.socketpair()
    errors: list[BaseException] = []

    def serve() -> None:
        try:
            with server.wrap_socket(a, server_side=True) as s:
                s.recv(1)
        except BaseException as exc:  # reported by the assertion below
            errors.append(exc)

    t = threading.Thread(target=serve)
    t.start()
    try:
        with client.wrap_socket(b, server_hostname=None) as c:
            version, cert = c.version(), c.getpeercert(binary_form=True)
            c.sendall(b"x")
    finally:
        t.join()
    assert not errors, errors
    return version, cert


def test_the_documented_openssl_pair_loads_and_handshakes(monkeypatch, tmp_path):
    """The docs' pair, given as the manifests give it (ca.crt a copy of tls.crt), makes
    the contexts the tasks use, and two tasks' ends complete a mutually verified
    handshake presenting it."""
    openssl = require("openssl", "openssl")
    command = _documented_openssl().split()
    proc = subprocess.run([openssl, *command[1:]], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    (tmp_path / "ca.crt").write_bytes((tmp_path / "tls.crt").read_bytes())
    monkeypatch.setenv(CERT, str(tmp_path / "tls.crt"))
    monkeypatch.setenv(KEY, str(tmp_path / "tls.key"))
    monkeypatch.setenv(CA, str(tmp_path / "ca.crt"))
    server, client = tls_contexts(JobConfig().tls)
    version, presented = _handshake(server, client)
    assert version in ("TLSv1.2", "TLSv1.3")
    der = subprocess.run([openssl, "x509", "-in", "tls.crt", "-outform", "DER"], cwd=tmp_path,
                         capture_output=True, timeout=60).stdout
    assert presented == der


def test_a_job_handle_without_a_config_does_not_read_the_tls_variables(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A client that only checks on a job (``JobHandle`` without a config) never builds a
    ``JobConfig``, so TLS variables naming files absent on the client's machine do not
    fail it; its deadlines are ``JobConfig``'s defaults."""
    from engine.dataflow.config import JobConfig
    from engine.runtime.deadlines import Deadlines
    from engine.runtime.handle import JobHandle

    monkeypatch.setenv("REFLOW_TLS_CERT_FILE", "/nonexistent/tls.crt")
    monkeypatch.setenv("REFLOW_TLS_KEY_FILE", "/nonexistent/tls.key")
    handle = JobHandle(None, "job", "")
    monkeypatch.delenv("REFLOW_TLS_CERT_FILE")
    monkeypatch.delenv("REFLOW_TLS_KEY_FILE")
    assert handle.deadlines == Deadlines.of(JobConfig())
