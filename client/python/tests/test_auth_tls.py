"""Bearer tokens and TLS against a real statecached (--tenants_file, --tls_*)."""
import hashlib
import os
import shutil
import subprocess

import pytest

import statecache as sc
from conftest import Server

GEOM = sc.Geometry("gdn", layers=1, h_qk=1, h_v=2, d_k=128, d_v=128)
TOKEN_A, TOKEN_B = "token-of-team-a", "token-of-team-b"


@pytest.fixture(scope="module")
def secure_server(statecached_binary, tmp_path_factory):
    if shutil.which("openssl") is None:
        pytest.fail("openssl not installed (needed to make the test certificate)")
    d = tmp_path_factory.mktemp("tls")
    key, cert = str(d / "key.pem"), str(d / "cert.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key,
                    "-out", cert, "-days", "1", "-subj", "/CN=statecache-test",
                    "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
                   check=True, capture_output=True)
    tenants = d / "tenants"
    tenants.write_text(
        "tenant team-a max_slots=3\n"
        f"token team-a sha256:{hashlib.sha256(TOKEN_A.encode()).hexdigest()}\n"
        "tenant team-b\n"
        f"token team-b sha256:{hashlib.sha256(TOKEN_B.encode()).hexdigest()}\n")
    s = Server(statecached_binary, [f"--tls_cert_file={cert}", f"--tls_key_file={key}",
                                    f"--tenants_file={tenants}", "--metrics_port=-1"])
    s.cert = cert
    yield s
    assert s.stop() == 0, "".join(s.log)


def test_token_and_tls(secure_server):
    with sc.Client(secure_server.target, timeout=20, token=TOKEN_A,
                   root_certificates=secure_server.cert) as a:
        info = a.register_model("m", GEOM, "damp", slots=8, checkpoints=1)
        assert info.model_id == "m"
        slots = a.allocate_slots("m", 3)
        with pytest.raises(sc.ResourceExhausted, match="max_slots"):  # tenant quota
            a.allocate_slots("m", 1)
        a.release_slots("m", slots)
        with a.update_stream("m") as s:  # the stream carries the token too
            import numpy as np
            x = np.zeros((1, 1, 128), np.float32)
            x[..., 0] = 1
            [slot] = a.allocate_slots("m", 1)
            r = s.update(0, [slot], x, x, np.ones((1, 2, 128), np.float32),
                         np.zeros((1, 2), np.float32), np.full((1, 2), 0.5, np.float32))
            assert r.o.shape == (1, 2, 128)
    with sc.Client(secure_server.target, timeout=20, token=TOKEN_B,
                   root_certificates=secure_server.cert) as b:
        with pytest.raises(sc.NotFound):  # team-a's model is invisible to team-b
            b.describe_model("m")
        assert [m.model_id for m in b.list_models()] == []


def test_missing_or_wrong_token_is_unauthenticated(secure_server):
    for token in (None, "not-a-token"):
        with sc.Client(secure_server.target, timeout=20, token=token,
                       root_certificates=secure_server.cert) as c:
            with pytest.raises(sc.errors.Unauthenticated):
                c.list_models()


def test_plaintext_client_cannot_talk_to_tls_server(secure_server):
    with sc.Client(secure_server.target, timeout=5, token=TOKEN_A) as c:
        with pytest.raises(sc.Unavailable):
            c.list_models()


def test_tls_argument_checks():
    with pytest.raises(sc.InvalidArgument, match="private_key and certificate_chain"):
        sc.Client("127.0.0.1:1", private_key=b"k")
