"""A secured Flower deployment (issue 13): TLS with certificates made here, SuperNode authentication
with keys made here. A SuperNode whose public key was registered joins and the run completes; one
whose key was not is refused by the SuperLink and exits."""

from __future__ import annotations

import datetime
import ipaddress
import json
import ssl
import subprocess
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip(
    "cryptography",
    reason="cryptography is not installed (flwr brings it); secured Flower tests skipped",
)

from cryptography import x509  # noqa: E402
from cryptography.hazmat.primitives import hashes, serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402
from cryptography.x509.oid import NameOID  # noqa: E402
from test_flower import dataset, run_config  # noqa: F401,E402  (dataset is a fixture)

from fedac.engine.data import build_federated_data  # noqa: E402
from fedac.flower.local import free_port  # noqa: E402
from fedac.flower.settings import fedac_config  # noqa: E402
from flower_helpers import BIN, PROCESS_WAIT, Federation  # noqa: E402

PEM = serialization.Encoding.PEM


def _certificate(subject: str, key, issuer: x509.Name, signer, ca: bool) -> x509.Certificate:
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if not ca:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
    return builder.sign(signer, hashes.SHA256())


def make_tls(folder: Path) -> None:
    """ca.pem (a self-signed CA) and server.pem / server.key for 127.0.0.1, signed by it."""
    ca_key, key = ec.generate_private_key(ec.SECP384R1()), ec.generate_private_key(ec.SECP384R1())
    ca = _certificate(
        "fedac test CA",
        ca_key,
        x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fedac test CA")]),
        ca_key,
        ca=True,
    )
    server = _certificate("127.0.0.1", key, ca.subject, ca_key, ca=False)
    (folder / "ca.pem").write_bytes(ca.public_bytes(PEM))
    (folder / "server.pem").write_bytes(server.public_bytes(PEM))
    (folder / "server.key").write_bytes(
        key.private_bytes(PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )


def make_node_key(path: Path) -> Path:
    """A SuperNode's ECDSA key pair in OpenSSH format (what `ssh-keygen -t ecdsa -b 384` writes)."""
    key = ec.generate_private_key(ec.SECP384R1())
    path.write_bytes(
        key.private_bytes(PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption())
    )
    path.with_suffix(".pub").write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
        )
    )
    return path


class SecureFederation(Federation):
    """Federation with TLS on the SuperLink and SuperNode authentication: only registered keys may
    join."""

    def __init__(self, folder: Path, num_nodes: int):
        super().__init__(folder, num_nodes)
        make_tls(self.folder)
        self.keys = [make_node_key(self.folder / f"node{k}.key") for k in range(num_nodes)]
        (self.home / "config.toml").write_text(
            '[superlink]\ndefault = "loopback"\n\n[superlink.loopback]\naddress = '
            f'"127.0.0.1:{self.port}"\nroot-certificates = "{self.folder / "ca.pem"}"\n'
        )

    def _healthy(self) -> bool:
        context = ssl.create_default_context(cafile=str(self.folder / "ca.pem"))
        try:
            with urllib.request.urlopen(
                f"https://127.0.0.1:{self.port}/health", timeout=2, context=context
            ) as response:
                return response.status == 200
        except OSError:
            return False

    def supernode(self, name: str, key: Path, partition: int) -> subprocess.Popen:
        return self._start(
            name,
            [
                str(BIN / "flower-supernode"),
                "--root-certificates",
                str(self.folder / "ca.pem"),
                "--auth-supernode-private-key",
                str(key),
                "--superlink",
                f"127.0.0.1:{self.port}",
                "--port",
                str(free_port()),
                "--node-config",
                f"partition-id={partition} num-partitions={self.num_nodes}",
            ],
        )

    def start(self, timeout: float = PROCESS_WAIT) -> None:
        self._start(
            "superlink",
            [
                str(BIN / "flower-superlink"),
                "--ssl-ca-certfile",
                str(self.folder / "ca.pem"),
                "--ssl-certfile",
                str(self.folder / "server.pem"),
                "--ssl-keyfile",
                str(self.folder / "server.key"),
                "--enable-supernode-auth",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--disable-runtime-dependency-installation",
            ],
        )
        self.wait_for(self._healthy, timeout, "the SuperLink's /health to answer over TLS")
        for key in self.keys:
            subprocess.run(
                [str(BIN / "flwr"), "supernode", "register", str(key.with_suffix(".pub"))],
                env=self.env,
                cwd=self.folder,
                check=True,
                capture_output=True,
                timeout=timeout,
            )
        for k, key in enumerate(self.keys):
            self.supernode(f"node{k}", key, k)
        self.wait_for(
            lambda: all(self.node_id(k) is not None for k in range(self.num_nodes)),
            timeout,
            "every registered SuperNode to join",
        )


@pytest.fixture(scope="module")
def secure_federation(tmp_path_factory, dataset):  # noqa: F811
    fed = SecureFederation(tmp_path_factory.mktemp("secure_federation"), 2)
    # feature cache
    build_federated_data(fedac_config(run_config(dataset, "unused", num_clients=2)), progress=False)
    try:
        fed.start()
        yield fed
    finally:
        fed.stop()


@pytest.mark.slow
def test_unregistered_supernode_is_refused(secure_federation):
    fed = secure_federation
    intruder = fed.supernode("intruder", make_node_key(fed.folder / "intruder.key"), 0)
    fed.procs.pop("intruder")  # expected to exit: not a server the federation waits on
    try:
        code = intruder.wait(timeout=PROCESS_WAIT)  # the event: the refused node exits
    except subprocess.TimeoutExpired:
        intruder.kill()
        pytest.fail(f"the unregistered SuperNode was not refused\n{fed.output()}")
    log = fed.logs["intruder"].read_text(errors="replace")
    assert code != 0 and "Failed to activate SuperNode" in log and "SuperNode ID" not in log, log


@pytest.mark.slow
def test_run_completes_over_tls_with_the_registered_nodes(secure_federation, dataset, tmp_path):  # noqa: F811
    run_dir = tmp_path / "run"
    config = run_config(
        dataset, run_dir, num_clients=2, **{"algorithm": "fedavg", "rounds": 1, "min-nodes": 2}
    )
    secure_federation.run(config, name="flwr-run-secure")
    results = json.loads((run_dir / "results.json").read_text())
    assert results["rounds"] == 1 and results["runtime"]["engine"] == "flower"
    assert sorted(results["runtime"]["nodes"].values()) == sorted(
        secure_federation.node_id(k) for k in range(2)
    )
