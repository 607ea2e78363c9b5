"""An S3-compatible object store on 127.0.0.1: S3Proxy (from Maven Central) over a folder of the work dir.

Tables on an object store behave unlike a local warehouse (no rename, no fsync, eventual listing in
real clouds); this is the store the sink's tests and ``fanout-sink stack up --with s3`` run against,
spoken to by the same two clients as in production: pyarrow's S3FileSystem (PyIceberg) and the AWS
SDK v2 (Iceberg's S3FileIO in Spark). Requests are signed (AWS v4) with a key pair made per stack.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass, field
from typing import Any

from fanout_sink import jars
from fanout_sink.devtools.stack.service import LocalServer, http_status, java, pick_port, single_jar

S3PROXY = jars.JarSet("s3proxy", "fanout_sink.devtools.stack")
"""S3Proxy's self-contained jar (``poms/s3proxy.xml``)."""
REGION = "us-east-1"
ACCESS_KEY_ENV = "FANOUT_SINK_S3_ACCESS_KEY_ID"
SECRET_KEY_ENV = "FANOUT_SINK_S3_SECRET_ACCESS_KEY"
ENDPOINT_ENV = "FANOUT_SINK_S3_ENDPOINT"
REGION_ENV = "FANOUT_SINK_S3_REGION"


@dataclass(frozen=True)
class S3Access:
    """How a client reaches an S3 store: this stack's S3Proxy or one elsewhere (docker's ``s3``
    service, a real bucket), from ``FANOUT_SINK_S3_*`` variables (``from_env``)."""

    endpoint: str
    access_key_id: str
    secret_access_key: str = field(repr=False)
    region: str = REGION

    @classmethod
    def from_env(cls) -> S3Access | None:
        """``FANOUT_SINK_S3_ENDPOINT`` with the key pair variables, or None when one is unset."""
        endpoint = os.environ.get(ENDPOINT_ENV)
        access, secret = os.environ.get(ACCESS_KEY_ENV), os.environ.get(SECRET_KEY_ENV)
        if not (endpoint and access and secret):
            return None
        return cls(endpoint, access, secret, os.environ.get(REGION_ENV, REGION))

    def pyiceberg_properties(self) -> dict[str, str]:
        """PyIceberg FileIO properties that reach this store (path-style addressing)."""
        return {
            "s3.endpoint": self.endpoint,
            "s3.access-key-id": self.access_key_id,
            "s3.secret-access-key": self.secret_access_key,
            "s3.region": self.region,
            "s3.force-virtual-addressing": "false",
        }

    def filesystem(self) -> Any:
        """A pyarrow S3FileSystem on this store."""
        from pyarrow import fs

        return fs.S3FileSystem(
            endpoint_override=self.endpoint,
            access_key=self.access_key_id,
            secret_key=self.secret_access_key,
            region=self.region,
            force_virtual_addressing=False,
            allow_bucket_creation=True,
        )

    def create_bucket(self, bucket: str) -> str:
        """Create ``bucket`` unless it exists; its ``s3://`` URL."""
        self.filesystem().create_dir(bucket)
        return f"s3://{bucket}"


@dataclass(frozen=True)
class ObjectStoreState:
    """Where the store listens and the one key pair it accepts (the secret is not shown in reprs)."""

    pid: int
    port: int
    log_file: str
    data_dir: str
    access_key_id: str
    secret_access_key: str = field(repr=False)
    region: str = REGION

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def access(self) -> S3Access:
        return S3Access(self.endpoint, self.access_key_id, self.secret_access_key, self.region)

    def pyiceberg_properties(self) -> dict[str, str]:
        return self.access.pyiceberg_properties()

    def filesystem(self) -> Any:
        return self.access.filesystem()

    def create_bucket(self, bucket: str) -> str:
        return self.access.create_bucket(bucket)


class ObjectStore(LocalServer[ObjectStoreState]):
    """S3Proxy with the ``filesystem-nio2`` backend: bucket ``b``, key ``k`` is file ``data/b/k``, so
    objects survive a kill and a restart of the store."""

    kind = "s3"
    title = "S3Proxy object store"
    state_type = ObjectStoreState

    def _launch(self, previous: ObjectStoreState | None) -> ObjectStoreState:
        jar = single_jar(S3PROXY)
        port = pick_port(self.requested_port, previous.port if previous else None)
        data_dir = self.work_dir / "s3-data"
        data_dir.mkdir(parents=True, exist_ok=True)
        access_key, secret_key = _keys(previous)
        config = self.work_dir / "s3proxy.properties"
        config.touch(mode=0o600)
        config.write_text(
            f"s3proxy.endpoint=http://{self.host}:{port}\n"
            "s3proxy.authorization=aws-v2-or-v4\n"
            f"s3proxy.identity={access_key}\n"
            f"s3proxy.credential={secret_key}\n"
            "jclouds.provider=filesystem-nio2\n"
            f"jclouds.filesystem.basedir={data_dir}\n"
        )
        pid = self._spawn(
            [java(), "-Xmx256m", "-Dlogback.statusListenerClass=ch.qos.logback.core.status.NopStatusListener",
             "-jar", str(jar), "--properties", str(config)]
        )  # fmt: skip
        return ObjectStoreState(
            pid=pid, port=port, log_file=str(self.log_file), data_dir=str(data_dir),
            access_key_id=access_key, secret_access_key=secret_key,
        )  # fmt: skip

    def _ready(self, state: ObjectStoreState) -> bool:
        # Unsigned requests are refused (403): an answer at all means S3Proxy serves.
        return http_status(state.endpoint + "/") is not None


def _keys(previous: ObjectStoreState | None) -> tuple[str, str]:
    """The key pair: from the environment (docker compose gives every service the same), else the
    previous run's (clients keep working across a restart), else new random ones."""
    access, secret = os.environ.get(ACCESS_KEY_ENV), os.environ.get(SECRET_KEY_ENV)
    if access and secret:
        return access, secret
    if previous is not None:
        return previous.access_key_id, previous.secret_access_key
    return "fanout" + secrets.token_hex(6), secrets.token_urlsafe(24)
