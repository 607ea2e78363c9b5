"""The ``kafka:`` section (librdkafka names) as options of Spark's Kafka source (Java client names).

The sink's own clients (workers, coordinator, control channel, admin) are confluent-kafka and take
the section as it is. Spark's Kafka source is the Java client, which differs in four ways:

- credentials: librdkafka has ``sasl.username``/``sasl.password``; Java has one ``sasl.jaas.config``
  naming a login module with the user and password inside, quoted;
- names: librdkafka's ``sasl.mechanisms`` is Java's ``sasl.mechanism``, and many librdkafka keys
  (``debug``, ``statistics.interval.ms``, ...) do not exist in Java, which logs a warning per unknown key;
- Spark refuses a few consumer keys outright (it manages offsets and deserialisation itself);
- TLS material: librdkafka (OpenSSL) takes a CA file, a certificate file and a key file in any form
  OpenSSL reads, or a PKCS#12 keystore; Java takes PEM stores, and its PEM reader knows only
  unencrypted or PBES1-encrypted PKCS#8 keys, while OpenSSL 3 encrypts keys with PBES2 by default.

So only keys the Java client knows are passed (the caller asks the JVM which, so the list matches the
kafka-clients version on Spark's classpath), the credentials are translated, and the TLS files are
read here, on the driver, into inline PEM options: the key decrypted and re-encoded as PKCS#8, so any
key librdkafka accepts works for Java too, and no path has to exist where the Java client runs.
Errors name keys, never values: the values next to them are secrets.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import dsa, ec, rsa
from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes
from cryptography.hazmat.primitives.serialization import pkcs12

# Login modules for the mechanisms whose JAAS config is just a user and a password.
LOGIN_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}
# Spark's Kafka source throws on these (see its "Kafka Specific Configurations" documentation).
SPARK_REFUSES = frozenset(
    {
        "auto.offset.reset",
        "enable.auto.commit",
        "interceptor.classes",
        "key.deserializer",
        "value.deserializer",
    }
)
_CREDENTIALS = ("sasl.username", "sasl.password")
_MECHANISM_ALIAS = "sasl.mechanisms"  # librdkafka's plural spelling of sasl.mechanism
_TLS_TRANSLATED = frozenset(
    {
        "ssl.ca.location",
        "ssl.ca.pem",
        "ssl.certificate.location",
        "ssl.certificate.pem",
        "ssl.key.location",
        "ssl.key.pem",
        "ssl.key.password",
        "ssl.keystore.location",
        "ssl.keystore.password",
        "ssl.endpoint.identification.algorithm",
    }
)
"""librdkafka TLS keys that :func:`java_tls_properties` turns into Java properties (some share a Java
name with another meaning: Java's ``ssl.keystore.location`` is JKS by default, its ``ssl.key.password``
would make it decrypt the already decrypted key)."""
_SAME_NAME_OTHER_VALUES = frozenset({"ssl.cipher.suites"})
"""Java knows the name but not librdkafka's values (OpenSSL cipher names, not IANA ones)."""
_INLINE = {
    "ssl.ca.location": "ssl.ca.pem",
    "ssl.certificate.location": "ssl.certificate.pem",
    "ssl.key.location": "ssl.key.pem",
}
"""librdkafka's TLS file keys and their inline PEM equivalents."""
_CA_PROBE = "probe"  # librdkafka: the system's CA store; Java's default truststore is its equivalent
_JAVA_KEY_TYPES = (rsa.RSAPrivateKey, ec.EllipticCurvePrivateKey, dsa.DSAPrivateKey)


class PropertyError(ValueError):
    """A ``kafka:`` property that cannot configure both clients. Names the key, never the value."""

    def __init__(self, key: str, problem: str, fix: str) -> None:
        super().__init__(f"{key}: {problem}; fix: {fix}")
        self.key = key
        self.problem = problem
        self.fix = fix


def jaas_quote(value: str) -> str:
    """A JAAS option value in double quotes; Kafka's JAAS parser reads backslash escapes inside them."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def sasl_jaas_config(kafka: Mapping[str, str]) -> str | None:
    """Java's ``sasl.jaas.config`` for librdkafka's ``sasl.username``/``sasl.password``; None without them.

    Raises ``ValueError`` when the section cannot serve both clients; ``load_config`` calls this so
    that the problem is reported before anything starts.
    """
    if "sasl.jaas.config" in kafka:
        raise ValueError(
            "sasl.jaas.config is a Java client property that librdkafka rejects; give sasl.username and "
            "sasl.password instead (the sink builds the JAAS config for Spark's Kafka source)"
        )
    given = [key for key in _CREDENTIALS if key in kafka]
    if not given:
        return None
    if len(given) == 1:
        missing = next(key for key in _CREDENTIALS if key not in kafka)
        raise ValueError(f"{given[0]} is set but {missing} is not; give both, e.g. {missing}: ${{ENV_VAR}}")
    mechanism = kafka.get("sasl.mechanism", kafka.get(_MECHANISM_ALIAS))
    if mechanism not in LOGIN_MODULES:
        raise ValueError(
            f"sasl.username/sasl.password need sasl.mechanism {', '.join(LOGIN_MODULES)} "
            f"(got {mechanism!r}); e.g. sasl.mechanism: PLAIN"
        )
    user, password = (jaas_quote(kafka[key]) for key in _CREDENTIALS)
    return f"{LOGIN_MODULES[mechanism]} required username={user} password={password};"


@dataclass(frozen=True)
class SparkKafkaOptions:
    """Options for ``spark.readStream.format("kafka")``, and the keys left out of them."""

    options: dict[str, str]
    left_out: tuple[str, ...]


def spark_kafka_options(kafka: Mapping[str, str], java_names: Collection[str]) -> SparkKafkaOptions:
    """``kafka.<name>`` options for the librdkafka properties in ``kafka``.

    ``java_names`` are the property names the Java consumer and admin client know; keys outside them
    (librdkafka-only) and keys Spark refuses are left out, the credentials become ``sasl.jaas.config``
    and the TLS files inline PEM stores (:func:`java_tls_properties`, which reads them: call this on
    the driver). Raises :class:`PropertyError` for TLS files that cannot be used.
    """
    options: dict[str, str] = {}
    left_out: list[str] = []
    for key, value in kafka.items():
        name = "sasl.mechanism" if key == _MECHANISM_ALIAS else key
        if key in _TLS_TRANSLATED or key in _CREDENTIALS:
            continue
        if name in java_names and name not in SPARK_REFUSES and name not in _SAME_NAME_OTHER_VALUES:
            options[f"kafka.{name}"] = value
        else:
            left_out.append(key)
    jaas = sasl_jaas_config(kafka)
    if jaas is not None:
        options["kafka.sasl.jaas.config"] = jaas
    options.update({f"kafka.{name}": value for name, value in java_tls_properties(kafka).items()})
    return SparkKafkaOptions(options, tuple(sorted(left_out)))


def java_tls_properties(kafka: Mapping[str, str]) -> dict[str, str]:
    """Java client TLS properties for librdkafka's: PEM trust and key stores with the certificates
    and the (decrypted, PKCS#8) key inline, and the host name check. Empty without TLS keys.

    Reads the files the keys name; raises :class:`PropertyError` naming the key of a file that is
    missing, unreadable or not what the key says, and of a key that cannot be decrypted.
    """
    if kafka.get("enable.ssl.certificate.verification", "true").lower() == "false":
        raise PropertyError(
            "enable.ssl.certificate.verification",
            "turns off the broker certificate check, which Spark's Java Kafka client cannot turn off "
            "(it would fail the TLS handshake that librdkafka passes)",
            "remove it and give the CA that signed the broker's certificate in ssl.ca.location",
        )
    properties: dict[str, str] = {}
    authorities = _certificates(kafka, "ssl.ca.location") + _certificates(kafka, "ssl.ca.pem")
    if authorities:
        properties["ssl.truststore.type"] = "PEM"
        properties["ssl.truststore.certificates"] = _pem(authorities)
    identity = _client_identity(kafka)
    if identity is not None:
        chain, key = identity
        properties["ssl.keystore.type"] = "PEM"
        properties["ssl.keystore.certificate.chain"] = _pem(chain)
        properties["ssl.keystore.key"] = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ).decode()
    algorithm = kafka.get("ssl.endpoint.identification.algorithm")
    if algorithm is not None:
        if algorithm.lower() not in {"https", "none"}:
            raise PropertyError(
                "ssl.endpoint.identification.algorithm",
                f"is {algorithm!r}; librdkafka knows https and none",
                "https checks the broker's host name against its certificate (the default); none does not",
            )
        properties["ssl.endpoint.identification.algorithm"] = "" if algorithm.lower() == "none" else "https"
    return properties


def inline_tls_files(kafka: Mapping[str, str]) -> dict[str, str]:
    """``kafka`` with the CA, certificate and key files replaced by their PEM text (``ssl.*.pem``,
    the key still encrypted with ``ssl.key.password``), read here on the driver: Spark tasks run
    librdkafka on executors, which may be other hosts where these paths do not exist.

    ``ssl.ca.location: probe`` (the host's CA store) stays, as does a PKCS#12 ``ssl.keystore.location``
    (librdkafka has no inline form of it). Raises :class:`PropertyError` for a file it cannot read.
    """
    inlined = dict(kafka)
    for location, pem in _INLINE.items():
        if location in kafka and kafka[location] != _CA_PROBE and pem not in kafka:
            data = _contents(kafka, location)
            assert data is not None, "the key is set"
            inlined[pem] = data.decode("ascii", errors="replace")
            del inlined[location]
    return inlined


def _pem(certificates: list[x509.Certificate]) -> str:
    return "".join(cert.public_bytes(serialization.Encoding.PEM).decode() for cert in certificates)


def _contents(kafka: Mapping[str, str], key: str) -> bytes | None:
    """The PEM text of ``key``: inline for ``*.pem`` keys, else the file (or for ``ssl.ca.location``
    the directory's files) it names; None when ``key`` is unset."""
    value = kafka.get(key)
    if value is None:
        return None
    if key.endswith(".pem"):
        return value.encode()
    path = Path(value)
    try:
        if path.is_dir() and key == "ssl.ca.location":
            return b"".join(child.read_bytes() + b"\n" for child in sorted(path.iterdir()) if child.is_file())
        return path.read_bytes()
    except OSError as exc:
        raise PropertyError(
            key,
            f"cannot read {value}: {exc.strerror}",
            "give a path that exists on the machine the sink starts from and that the sink may read",
        ) from None


def _certificates(kafka: Mapping[str, str], key: str) -> list[x509.Certificate]:
    if kafka.get(key) == _CA_PROBE and key == "ssl.ca.location":
        return []
    data = _contents(kafka, key)
    if data is None:
        return []
    try:
        return x509.load_pem_x509_certificates(data)
    except ValueError:
        raise PropertyError(
            key,
            "holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
            "give PEM certificates; convert a DER one with "
            "`openssl x509 -inform der -in cert.der -out cert.pem`",
        ) from None


def _client_identity(kafka: Mapping[str, str]) -> tuple[list[x509.Certificate], PrivateKeyTypes] | None:
    """The client certificate chain and its key, from PEM keys or a PKCS#12 keystore; None without."""
    if "ssl.keystore.location" in kafka:
        return _keystore(kafka)
    cert_key = next((k for k in ("ssl.certificate.location", "ssl.certificate.pem") if k in kafka), None)
    key_key = next((k for k in ("ssl.key.location", "ssl.key.pem") if k in kafka), None)
    if cert_key is None and key_key is None:
        return None
    if cert_key is None or key_key is None:
        given, missing = (
            (cert_key, "ssl.certificate.location") if key_key is None else (key_key, "ssl.key.location")
        )
        raise PropertyError(
            str(given),
            f"a client certificate needs both its certificate and its key, but {missing} is not set",
            f"set {missing} too, or remove {given} to connect without a client certificate",
        )
    chain = _certificates(kafka, cert_key)
    return chain, _private_key(kafka, key_key)


def _private_key(kafka: Mapping[str, str], key_key: str) -> PrivateKeyTypes:
    data = _contents(kafka, key_key)
    assert data is not None, "the caller checked that the key is set"
    password = kafka.get("ssl.key.password")
    encrypted = b"ENCRYPTED" in data
    if encrypted and not password:
        raise PropertyError(
            "ssl.key.password",
            f"is not set, but the key in {key_key} is encrypted",
            "set ssl.key.password to the key's password, e.g. ssl.key.password: ${KAFKA_KEY_PASSWORD}",
        )
    try:
        key = serialization.load_pem_private_key(data, password.encode() if encrypted and password else None)
    except ValueError:
        if encrypted:
            raise PropertyError(
                "ssl.key.password",
                f"does not decrypt the key in {key_key}",
                "give the password the key was encrypted with (or the environment variable it comes from)",
            ) from None
        raise PropertyError(
            key_key,
            "holds no PEM private key that OpenSSL can read",
            "give the client certificate's private key in PEM (-----BEGIN PRIVATE KEY-----); convert a DER "
            "one with `openssl pkey -inform der -in key.der -out key.pem`",
        ) from None
    except UnsupportedAlgorithm:
        raise PropertyError(
            key_key, "is encrypted with a cipher this machine's OpenSSL does not offer",
            "re-encrypt it: `openssl pkcs8 -topk8 -v2 aes-256-cbc -in key.pem -out key-pkcs8.pem`",
        ) from None  # fmt: skip
    return _java_readable(key, key_key)


def _java_readable(key: PrivateKeyTypes, key_key: str) -> PrivateKeyTypes:
    if not isinstance(key, _JAVA_KEY_TYPES):
        raise PropertyError(
            key_key,
            f"is a {type(key).__name__.removeprefix('_')} key; Spark's Java Kafka client reads RSA, EC and "
            "DSA keys only",
            "issue the client certificate for an RSA or EC key (e.g. `openssl genpkey -algorithm RSA`)",
        )
    return key


def _keystore(kafka: Mapping[str, str]) -> tuple[list[x509.Certificate], PrivateKeyTypes]:
    """librdkafka's ``ssl.keystore.location`` is a PKCS#12 file with the key and its certificate chain."""
    data = _contents(kafka, "ssl.keystore.location")
    assert data is not None, "the caller checked that the keystore is set"
    password = kafka.get("ssl.keystore.password")
    try:
        key, cert, extra = pkcs12.load_key_and_certificates(data, password.encode() if password else None)
    except ValueError:
        raise PropertyError(
            "ssl.keystore.location",
            "is not a PKCS#12 keystore that ssl.keystore.password opens",
            "give a PKCS#12 file (`openssl pkcs12 -export -in cert.pem -inkey key.pem -out client.p12`) "
            "and its password in ssl.keystore.password",
        ) from None
    if key is None or cert is None:
        raise PropertyError(
            "ssl.keystore.location",
            "holds no private key with its certificate",
            "export the client's key and certificate into it (`openssl pkcs12 -export ...`)",
        )
    return [cert, *extra], _java_readable(key, "ssl.keystore.location")
