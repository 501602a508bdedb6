"""Credentials and client options for obstore's S3 stores, from floe's settings, the environment and AWS profiles
(see :mod:`ingest.remote`)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ingest.remote._errors import RemoteError

if TYPE_CHECKING:
    from obstore.store import S3Credential

# ClientConfig keys (obstore/_store/_client.pyi) that object_store also reads from the environment as AWS_<KEY>.
_CLIENT_KEYS = (
    "allow_http",
    "allow_invalid_certificates",
    "connect_timeout",
    "default_content_type",
    "http1_only",
    "http2_keep_alive_interval",
    "http2_keep_alive_timeout",
    "http2_keep_alive_while_idle",
    "http2_only",
    "pool_idle_timeout",
    "pool_max_idle_per_host",
    "proxy_ca_certificate",
    "proxy_excludes",
    "proxy_url",
    "randomize_addresses",
    "read_timeout",
    "timeout",
    "user_agent",
)


def environment_client_options(prefix: str) -> dict[str, Any]:
    """Client options the environment sets for ``prefix`` (``AWS_ALLOW_HTTP`` -> ``allow_http``).

    obstore builds an S3 store from the environment but replaces all of its
    client options with the ones passed in (pyo3-object_store ``aws/store.rs``:
    ``from_env()`` then ``with_client_options``), dropping ``AWS_ALLOW_HTTP``,
    ``AWS_PROXY_URL`` and the timeouts, so floe passes these along itself.
    """
    return {key: os.environ[f"{prefix}{key.upper()}"] for key in _CLIENT_KEYS if f"{prefix}{key.upper()}" in os.environ}


@dataclass(frozen=True)
class StaticCredentials:
    """Credentials from floe's settings, used instead of whatever the environment holds (a stray
    ``AWS_SESSION_TOKEN`` must not join keys it does not belong to)."""

    access_key_id: str
    secret_access_key: str = field(repr=False)
    token: str | None = field(default=None, repr=False)

    def __call__(self) -> S3Credential:
        return {
            "access_key_id": self.access_key_id,
            "secret_access_key": self.secret_access_key,
            "token": self.token,
            "expires_at": None,
        }


def aws_profile() -> str | None:
    """The AWS profile to read keys from: ``AWS_PROFILE`` (or ``AWS_DEFAULT_PROFILE``), when the environment
    holds no keys of its own (they win, as in every AWS SDK); None otherwise."""
    if os.environ.get("AWS_ACCESS_KEY_ID"):
        return None
    return os.environ.get("AWS_PROFILE") or os.environ.get("AWS_DEFAULT_PROFILE") or None


def profile_credentials(profile: str) -> tuple[Any, str | None]:
    """A refreshing credential provider for ``profile``, read through boto3 since obstore reads no ``~/.aws`` files
    (``~/.aws/credentials``/``config``, or the files
    ``AWS_SHARED_CREDENTIALS_FILE``/``AWS_CONFIG_FILE`` name), and the profile's region.

    Raises:
        RemoteError: boto3 is missing, or the profile does not exist or holds no credentials.
    """
    url = f"aws profile {profile}"
    try:
        import boto3
        from botocore.exceptions import BotoCoreError
        from obstore.auth.boto3 import Boto3CredentialProvider
    except ImportError as error:
        raise RemoteError(url, f"reading AWS profiles needs boto3 ({error})") from error
    try:
        session = boto3.Session(profile_name=profile)
        return Boto3CredentialProvider(session), session.region_name
    except (BotoCoreError, ValueError) as error:
        raise RemoteError(url, f"no usable credentials in it ({error})") from error
