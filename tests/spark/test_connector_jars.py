"""The Spark jar sets agree with the PySpark they run in, and the JVM sees ONE AWS SDK.

Iceberg's S3FileIO and Hadoop's s3a both load ``software.amazon.awssdk`` classes from the driver's
class path: two SDK copies (hadoop-aws's 640 MB ``bundle`` beside Iceberg's) would make which one
wins depend on jar order. The object-store set replaces hadoop-aws's SDK with Iceberg's bundle.
"""

from __future__ import annotations

import re
import zipfile
from pathlib import Path

import pyspark

from fanout_sink import jars
from fanout_sink.catalog import CatalogSettings
from fanout_sink.spark.session import SPARK_CONNECTORS, SPARK_OBJECT_STORE, connector_jars

SDK_CLASS = "software/amazon/awssdk/services/s3/S3Client.class"
VERSION_CLASS = "software/amazon/awssdk/core/util/VersionInfo.class"


def _pom_property(jar_set: jars.JarSet, name: str) -> str:
    text = (Path(__file__).resolve().parents[2] / jar_set.pom_path).read_text()
    match = re.search(f"<{re.escape(name)}>([^<]+)</{re.escape(name)}>", text)
    assert match is not None, f"{name} not in {jar_set.pom_path}"
    return match.group(1)


def _pyspark_jars() -> list[Path]:
    return sorted((Path(pyspark.__file__).parent / "jars").glob("*.jar"))


def test_versions_match_pyspark_and_each_other() -> None:
    assert _pom_property(SPARK_CONNECTORS, "spark.version") == pyspark.__version__
    hadoop = [p.name for p in _pyspark_jars() if p.name.startswith("hadoop-client-api-")]
    assert hadoop == [f"hadoop-client-api-{_pom_property(SPARK_OBJECT_STORE, 'hadoop.version')}.jar"]
    iceberg = _pom_property(SPARK_CONNECTORS, "iceberg.version")
    assert _pom_property(SPARK_OBJECT_STORE, "iceberg.version") == iceberg


def test_one_aws_sdk_shared_by_s3_file_io_and_s3a() -> None:
    every = [*_pyspark_jars(), *jars.jars(SPARK_CONNECTORS), *jars.jars(SPARK_OBJECT_STORE)]
    names = [p.name for p in every]
    assert not any(name.startswith("bundle-") for name in names)  # hadoop-aws's own SDK stays out
    assert any(name.startswith("hadoop-aws-") for name in names)
    with_sdk = [p for p in every if SDK_CLASS in zipfile.ZipFile(p).namelist()]
    assert [p.name for p in with_sdk] == [
        f"iceberg-aws-bundle-{_pom_property(SPARK_CONNECTORS, 'iceberg.version')}.jar"
    ]
    version = zipfile.ZipFile(with_sdk[0]).read(VERSION_CLASS)
    sdk = _pom_property(SPARK_OBJECT_STORE, "awssdk.version")
    assert sdk.encode() in version, f"the bundle's AWS SDK is not {sdk}"
    assert f"s3-transfer-manager-{sdk}.jar" in names  # the one SDK module s3a needs beyond the bundle


def test_object_store_jars_only_when_s3_is_used(tmp_path: Path) -> None:
    local = CatalogSettings(name="c", uri=f"sqlite:///{tmp_path / 'c.db'}", warehouse=f"file://{tmp_path}")
    on_s3 = CatalogSettings(name="c", type="rest", uri="http://r", warehouse="s3://b/w")
    bundle = "iceberg-aws-bundle"
    assert not any(bundle in jar for jar in connector_jars(local))
    assert not any(bundle in jar for jar in connector_jars(local, str(tmp_path / "ck")))
    assert any(bundle in jar for jar in connector_jars(local, "s3a://b/ck"))
    assert any(bundle in jar for jar in connector_jars(on_s3))
    vended = CatalogSettings(name="c", type="rest", uri="http://r", warehouse="wh")  # no s3.* keys here
    assert any(bundle in jar for jar in connector_jars(vended))
    assert any("postgresql-" in jar for jar in connector_jars(local))
