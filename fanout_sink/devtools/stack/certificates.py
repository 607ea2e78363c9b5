"""A private certificate authority and the broker's and a client's certificates, as PEM files.

What a team with its own CA hands a Kafka client: the CA certificate, a client certificate and its
key encrypted with a password. The key is encrypted the way OpenSSL 3 does by default (PKCS#8,
PBES2/AES-256), which Java's PEM reader cannot decrypt: the sink must convert it for Spark's Kafka
source, and a test broker with such a key shows that it does. Made with ``cryptography``, which the
sink needs anyway for that conversion, so no ``openssl`` binary is needed.
"""

from __future__ import annotations

import datetime
import ipaddress
import secrets
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALID = datetime.timedelta(days=825)
_CLOCK_SKEW = datetime.timedelta(days=1)


@dataclass(frozen=True)
class TlsFiles:
    """The PEM files in ``folder``: ``ca`` signed ``server`` (127.0.0.1 and localhost) and ``client``."""

    folder: Path

    @property
    def ca(self) -> Path:
        return self.folder / "ca.pem"

    @property
    def server(self) -> Path:
        """The broker's PKCS#8 key followed by its certificate (Kafka's PEM keystore file)."""
        return self.folder / "server.pem"

    @property
    def client_cert(self) -> Path:
        return self.folder / "client.crt"

    @property
    def client_key(self) -> Path:
        """The client's key, PKCS#8 encrypted with :attr:`client_key_password`."""
        return self.folder / "client.key"

    @property
    def client_key_password(self) -> str:
        return (self.folder / "client.key.password").read_text()

    def exist(self) -> bool:
        return all(path.is_file() for path in (self.ca, self.server, self.client_cert, self.client_key))

    def client_properties(self) -> dict[str, str]:
        """librdkafka properties that present the client certificate and trust the private CA."""
        return {
            "ssl.ca.location": str(self.ca),
            "ssl.certificate.location": str(self.client_cert),
            "ssl.key.location": str(self.client_key),
            "ssl.key.password": self.client_key_password,
        }


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "fanout-sink test stack"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def _key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _certificate(
    subject: str,
    key: rsa.RSAPrivateKey,
    issuer: x509.Certificate | None,
    issuer_key: rsa.RSAPrivateKey,
    extensions: list[tuple[x509.ExtensionType, bool]],
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer.subject if issuer is not None else _name(subject))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _CLOCK_SKEW)
        .not_valid_after(now + _VALID)
    )
    for extension, critical in extensions:
        builder = builder.add_extension(extension, critical)
    return builder.sign(issuer_key, hashes.SHA256())


def _pem(key: rsa.RSAPrivateKey, password: str | None = None) -> bytes:
    encryption: serialization.KeySerializationEncryption = (
        serialization.BestAvailableEncryption(password.encode())
        if password is not None
        else serialization.NoEncryption()
    )
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)


def make_tls_files(
    folder: Path, ca_name: str = "fanout-sink test CA", key_password: str | None = None
) -> TlsFiles:
    """Create a new CA and certificates in ``folder``, or reuse the ones there (a restarted broker
    keeps its certificates, so that clients configured for it still connect). The client key's
    password is ``key_password`` or a random one (a secrets test gives a marker it searches for)."""
    files = TlsFiles(folder)
    if files.exist():
        return files
    folder.mkdir(parents=True, exist_ok=True)
    ca_key = _key()
    ca = _certificate(ca_name, ca_key, None, ca_key, [(x509.BasicConstraints(ca=True, path_length=0), True)])
    server_key, client_key = _key(), _key()
    server = _certificate(
        "localhost", server_key, ca, ca_key,
        [
            (x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ), False),
            (x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False),
        ],
    )  # fmt: skip
    client = _certificate(
        "fanout-sink client", client_key, ca, ca_key,
        [(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), False)],
    )  # fmt: skip
    password = key_password or secrets.token_urlsafe(16)
    pem = serialization.Encoding.PEM
    (folder / "client.key.password").write_text(password)
    files.client_key.write_bytes(_pem(client_key, password))
    files.client_cert.write_bytes(client.public_bytes(pem))
    files.server.write_bytes(_pem(server_key) + server.public_bytes(pem))
    files.ca.write_bytes(ca.public_bytes(pem))  # last: exist() means complete
    for path in folder.iterdir():
        path.chmod(0o600)
    return files
