"""librdkafka properties -> Spark Kafka source options: credentials, TLS stores, names, keys left out."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519, rsa
from cryptography.hazmat.primitives.serialization import pkcs12

from fanout_sink.config.loading import load_config
from fanout_sink.config.secrets import is_secret_key
from fanout_sink.devtools.stack.certificates import TlsFiles, make_tls_files
from fanout_sink.errors import ConfigError
from fanout_sink.kafka.java_client import (
    PropertyError,
    inline_tls_files,
    java_tls_properties,
    sasl_jaas_config,
    spark_kafka_options,
)

JAVA_NAMES = {"bootstrap.servers", "security.protocol", "sasl.mechanism", "enable.auto.commit", "client.id"}


def test_plain_credentials_become_a_quoted_jaas_config() -> None:
    kafka = {
        "bootstrap.servers": "b:9092",
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanisms": "PLAIN",  # librdkafka's plural spelling
        "sasl.username": "sink",
        "sasl.password": 'p"w\\d',
        "debug": "all",  # librdkafka only
        "enable.auto.commit": "false",  # known to Java, refused by Spark's source
    }
    result = spark_kafka_options(kafka, JAVA_NAMES)
    assert result.options == {
        "kafka.bootstrap.servers": "b:9092",
        "kafka.security.protocol": "SASL_PLAINTEXT",
        "kafka.sasl.mechanism": "PLAIN",
        "kafka.sasl.jaas.config": "org.apache.kafka.common.security.plain.PlainLoginModule required "
        'username="sink" password="p\\"w\\\\d";',
    }
    assert result.left_out == ("debug", "enable.auto.commit")


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_scram_uses_the_scram_login_module(mechanism: str) -> None:
    jaas = sasl_jaas_config({"sasl.mechanism": mechanism, "sasl.username": "u", "sasl.password": "p"})
    assert (
        jaas == 'org.apache.kafka.common.security.scram.ScramLoginModule required username="u" password="p";'
    )


def test_without_credentials_nothing_is_added() -> None:
    result = spark_kafka_options({"bootstrap.servers": "b:9092"}, JAVA_NAMES)
    assert result.options == {"kafka.bootstrap.servers": "b:9092"} and result.left_out == ()


@pytest.mark.parametrize(
    ("kafka", "named"),
    [
        ({"sasl.username": "u", "sasl.password": "SECRET"}, "sasl.mechanism"),
        ({"sasl.mechanism": "GSSAPI", "sasl.username": "u", "sasl.password": "SECRET"}, "sasl.mechanism"),
        ({"sasl.mechanism": "PLAIN", "sasl.password": "SECRET"}, "sasl.username"),
        ({"sasl.jaas.config": 'x required password="SECRET";'}, "sasl.username"),
    ],
)
def test_untranslatable_credentials_are_refused_naming_keys_not_values(
    kafka: dict[str, str], named: str
) -> None:
    with pytest.raises(ValueError, match=named) as raised:
        sasl_jaas_config(kafka)
    assert "SECRET" not in str(raised.value)


# --------------------------------------------------------------------------------------------
# TLS: librdkafka's CA, certificate and key files -> inline PEM stores for the Java client


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    """A private CA and a client certificate whose key is encrypted the way OpenSSL 3 does (PBES2)."""
    return make_tls_files(tmp_path_factory.mktemp("tls"))


def _client_key(tls: TlsFiles) -> rsa.RSAPrivateKey:
    key = serialization.load_pem_private_key(tls.client_key.read_bytes(), tls.client_key_password.encode())
    assert isinstance(key, rsa.RSAPrivateKey)
    return key


def test_mtls_files_become_inline_pem_stores(tls: TlsFiles) -> None:
    kafka = {"bootstrap.servers": "b:9093", "security.protocol": "SSL", **tls.client_properties()}
    assert tls.client_key.read_text().startswith("-----BEGIN ENCRYPTED PRIVATE KEY-----")
    result = spark_kafka_options(kafka, JAVA_NAMES | {"ssl.key.password", "ssl.keystore.location"})
    options = result.options
    assert options["kafka.security.protocol"] == "SSL"
    assert options["kafka.ssl.truststore.type"] == options["kafka.ssl.keystore.type"] == "PEM"
    assert options["kafka.ssl.truststore.certificates"] == tls.ca.read_text()
    assert options["kafka.ssl.keystore.certificate.chain"] == tls.client_cert.read_text()
    java_pem = options["kafka.ssl.keystore.key"]
    assert java_pem.startswith("-----BEGIN PRIVATE KEY-----"), (
        "unencrypted PKCS#8: Java's PEM reader takes it"
    )
    java_key = serialization.load_pem_private_key(java_pem.encode(), None)
    assert java_key.public_key() == _client_key(tls).public_key(), "the same key, decrypted"
    # No paths (executors may run elsewhere) and no password (Java would try to decrypt the key again).
    assert not any(name.endswith((".location", ".password")) for name in options), sorted(options)
    assert result.left_out == ()


def test_inline_pem_properties_give_the_same_stores(tls: TlsFiles) -> None:
    from_files = java_tls_properties(tls.client_properties())
    inline = java_tls_properties(
        {
            "ssl.ca.pem": tls.ca.read_text(),
            "ssl.certificate.pem": tls.client_cert.read_text(),
            "ssl.key.pem": tls.client_key.read_text(),
            "ssl.key.password": tls.client_key_password,
        }
    )
    assert inline == from_files


@pytest.mark.parametrize("password", [None, "legacy-pw"])
def test_a_pkcs1_key_is_converted_to_pkcs8(tls: TlsFiles, tmp_path: Path, password: str | None) -> None:
    """OpenSSL (librdkafka) reads "BEGIN RSA PRIVATE KEY", plain or with legacy PEM encryption;
    Java does not, so the key it gets is PKCS#8."""
    encryption: serialization.KeySerializationEncryption = (
        serialization.BestAvailableEncryption(password.encode()) if password else serialization.NoEncryption()
    )
    pkcs1 = tmp_path / "client-rsa.key"
    pkcs1.write_bytes(
        _client_key(tls).private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL, encryption
        )
    )
    assert pkcs1.read_text().startswith("-----BEGIN RSA PRIVATE KEY-----")
    kafka = {**tls.client_properties(), "ssl.key.location": str(pkcs1)}
    if password is None:
        del kafka["ssl.key.password"]
    else:
        kafka["ssl.key.password"] = password
    assert java_tls_properties(kafka) == java_tls_properties(tls.client_properties())


def test_a_pkcs12_keystore_becomes_pem_stores(tls: TlsFiles, tmp_path: Path) -> None:
    """librdkafka's ssl.keystore.location is PKCS#12 (Java's default keystore type is JKS)."""
    cert = x509.load_pem_x509_certificate(tls.client_cert.read_bytes())
    store = tmp_path / "client.p12"
    store.write_bytes(
        pkcs12.serialize_key_and_certificates(
            b"client", _client_key(tls), cert, None, serialization.BestAvailableEncryption(b"store-pw")
        )
    )
    kafka = {
        "ssl.ca.location": str(tls.ca),
        "ssl.keystore.location": str(store),
        "ssl.keystore.password": "store-pw",
    }
    assert java_tls_properties(kafka) == java_tls_properties(tls.client_properties())


def test_a_ca_directory_and_probe(tls: TlsFiles, tmp_path: Path) -> None:
    other = make_tls_files(tmp_path / "other", ca_name="another CA")
    folder = tmp_path / "cas"
    folder.mkdir()
    (folder / "a.pem").write_bytes(tls.ca.read_bytes())
    (folder / "b.pem").write_bytes(other.ca.read_bytes())
    trusted = java_tls_properties({"ssl.ca.location": str(folder)})["ssl.truststore.certificates"]
    assert trusted == tls.ca.read_text() + other.ca.read_text()
    # librdkafka's "probe" means the system's CAs: Java's default truststore, so nothing is set.
    assert java_tls_properties({"ssl.ca.location": "probe", "security.protocol": "SSL"}) == {}


@pytest.mark.parametrize(("librdkafka", "java"), [("https", "https"), ("none", ""), ("NONE", "")])
def test_endpoint_identification(librdkafka: str, java: str) -> None:
    properties = java_tls_properties({"ssl.endpoint.identification.algorithm": librdkafka})
    assert properties == {"ssl.endpoint.identification.algorithm": java}


def test_librdkafka_cipher_names_are_not_given_to_java() -> None:
    kafka = {"ssl.cipher.suites": "ECDHE-RSA-AES256-GCM-SHA384"}
    assert spark_kafka_options(kafka, {"ssl.cipher.suites"}).left_out == ("ssl.cipher.suites",)


def _garbage(tmp_path: Path) -> Path:
    path = tmp_path / "garbage.pem"
    path.write_text("not a PEM file\n")
    return path


def _ed25519(tmp_path: Path) -> Path:
    path = tmp_path / "ed25519.key"
    path.write_bytes(
        ed25519.Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return path


@pytest.mark.parametrize(
    ("change", "named", "says"),
    [
        (lambda t, p: {"ssl.ca.location": str(p / "missing.pem")}, "ssl.ca.location", "cannot read"),
        (lambda t, p: {"ssl.ca.location": str(_garbage(p))}, "ssl.ca.location", "no PEM certificate"),
        (lambda t, p: {"ssl.certificate.location": str(t.client_key)}, "ssl.certificate.location", "no PEM"),
        (lambda t, p: {"ssl.key.location": str(p / "missing.key")}, "ssl.key.location", "cannot read"),
        (lambda t, p: {"ssl.key.location": str(_garbage(p))}, "ssl.key.location", "no PEM private key"),
        (lambda t, p: {"ssl.key.location": str(_ed25519(p))}, "ssl.key.location", "RSA, EC and DSA"),
        (lambda t, p: {"ssl.key.password": "MARKER-wrong"}, "ssl.key.password", "does not decrypt"),
        (lambda t, p: {"ssl.key.password": None}, "ssl.key.password", "is encrypted"),
        (lambda t, p: {"ssl.certificate.location": None}, "ssl.key.location", "needs both"),
        (lambda t, p: {"ssl.keystore.location": str(_garbage(p))}, "ssl.keystore.location", "PKCS#12"),
        (lambda t, p: {"ssl.endpoint.identification.algorithm": "ldaps"}, "ssl.endpoint", "https and none"),
        (lambda t, p: {"enable.ssl.certificate.verification": "false"}, "enable.ssl", "cannot turn off"),
    ],
)  # fmt: skip
def test_unusable_tls_settings_name_the_key_not_the_secret(
    tls: TlsFiles,
    tmp_path: Path,
    change: Callable[[TlsFiles, Path], dict[str, str | None]],
    named: str,
    says: str,
) -> None:
    kafka = {**tls.client_properties(), **change(tls, tmp_path)}
    kafka = {key: value for key, value in kafka.items() if value is not None}
    with pytest.raises(PropertyError) as raised:
        java_tls_properties(kafka)
    message = str(raised.value)
    assert raised.value.key.startswith(named) and says in message, message
    assert "fix: " in message
    for secret in (tls.client_key_password, "MARKER", "PRIVATE KEY-----\n"):
        assert secret not in message


def test_load_config_names_the_yaml_key_of_an_unusable_tls_file(tls: TlsFiles, tmp_path: Path) -> None:
    def load(kafka: dict[str, str]) -> None:
        config = tmp_path / "sink.yaml"
        sink = {"name": "s", "kafka": kafka, "source": {"topics": ["t"]}, "tables": {"a.b": {}}}
        config.write_text(yaml.safe_dump(sink))
        load_config(config)

    load({"security.protocol": "SSL", **tls.client_properties()})  # usable: no error
    with pytest.raises(ConfigError, match=r'sink\.yaml: kafka\."ssl\.ca\.location": cannot read .*missing'):
        load({**tls.client_properties(), "ssl.ca.location": str(tmp_path / "missing.pem")})
    with pytest.raises(ConfigError, match=r'kafka\."ssl\.key\.password": does not decrypt') as raised:
        load({**tls.client_properties(), "ssl.key.password": "MARKER-wrong"})
    assert "MARKER" not in str(raised.value)


def test_option_values_with_key_material_or_passwords_are_redacted(tls: TlsFiles) -> None:
    """Spark hides option values whose names match spark.redaction.regex (SECRET_KEY_PATTERN)."""
    kafka = {
        **tls.client_properties(),
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-256",
        "sasl.username": "u",
        "sasl.password": "p",
    }
    options = spark_kafka_options(kafka, JAVA_NAMES).options
    secret = {name for name, value in options.items() if "PRIVATE KEY" in value or "password=" in value}
    assert secret == {"kafka.ssl.keystore.key", "kafka.sasl.jaas.config"}
    assert all(is_secret_key(name) for name in secret)
    assert not is_secret_key("kafka.ssl.truststore.certificates"), "certificates are public"


def test_tls_files_are_inlined_for_librdkafka_on_executors(tls: TlsFiles) -> None:
    """Tasks get PEM text instead of paths (which other hosts may lack); the key stays encrypted."""
    kafka = {"security.protocol": "SSL", **tls.client_properties()}
    inlined = inline_tls_files(kafka)
    assert inlined == {
        "security.protocol": "SSL",
        "ssl.ca.pem": tls.ca.read_text(),
        "ssl.certificate.pem": tls.client_cert.read_text(),
        "ssl.key.pem": tls.client_key.read_text(),
        "ssl.key.password": tls.client_key_password,
    }
    assert java_tls_properties(inlined) == java_tls_properties(kafka)
    assert inline_tls_files({"ssl.ca.location": "probe"}) == {"ssl.ca.location": "probe"}


def test_the_java_clients_property_names_are_read_from_the_jvm_whole(spark: Any) -> None:
    """One joined string per set, not an iteration through Py4J: the same names as iterating."""
    from fanout_sink.spark.source import java_client_names

    clients = spark._jvm.org.apache.kafka.clients
    sets = (clients.consumer.ConsumerConfig.configNames(), clients.admin.AdminClientConfig.configNames())
    iterated = {str(name) for names in sets for name in names}
    names = java_client_names(spark)
    assert names == iterated and {"bootstrap.servers", "isolation.level", "sasl.jaas.config"} <= names
