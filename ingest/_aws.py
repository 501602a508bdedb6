"""One S3 configuration for a repository: floe's ``s3`` settings over the ``AWS_*`` environment over a profile.

Icechunk, PyIceberg's FileIO and obstore each read the environment their own way; :func:`repository_s3` reads it
once into one :class:`~ingest.config.S3Settings` that every client is given explicitly, and refuses in one line a
combination some client would read differently. Why: docs/design.md §8 (one S3 configuration); where each setting
comes from: docs/configuration.md#object-storage.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from urllib.parse import urlparse

from ingest.config import REGION_NAME, S3Settings
from ingest.errors import InvalidSettings

ENDPOINT_REGION = "us-east-1"
"""The region requests to a custom endpoint are signed for when no setting names one (as the AWS SDKs do): what
S3-compatible servers accept, and what keeps PyIceberg from asking AWS where the bucket is."""
_TRUE = frozenset(("1", "true", "yes", "on"))


def _flag(environ: Mapping[str, str], name: str) -> bool | None:
    value = environ.get(name)
    return None if value is None or value == "" else value.strip().lower() in _TRUE


def _first(environ: Mapping[str, str], *names: str) -> tuple[str, str] | None:
    """The first of ``names`` set (non-empty) in ``environ``, with its value."""
    for name in names:
        value = environ.get(name)
        if value:
            return name, value
    return None


def repository_s3(s3: S3Settings, environ: Mapping[str, str] | None = None) -> S3Settings:
    """The S3 settings every client of an ``s3://`` repository is given (docs/configuration.md#object-storage says
    where each comes from).

    Args:
        s3: floe's ``s3`` settings (``FLOE_S3__*``, a config file); what they set wins.
        environ: the environment to read (default: ``os.environ``).

    Returns:
        Settings with the endpoint, region, plain-HTTP permission, addressing style
        and, where any source holds them, keys filled in.

    Raises:
        InvalidSettings: an endpoint that is not an http(s) URL, a plain-HTTP endpoint without
            ``allow_http``, half a key pair, a region that is no region's name, or a profile
            that does not exist or holds no keys.
    """
    environ = os.environ if environ is None else environ
    endpoint_from = "FLOE_S3__ENDPOINT_URL"
    endpoint = s3.endpoint_url
    if not endpoint and (found := _first(environ, "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")):
        endpoint_from, endpoint = found
    region_from = "FLOE_S3__REGION"
    region = s3.region
    if not region and (found := _first(environ, "AWS_REGION", "AWS_DEFAULT_REGION")):
        region_from, region = found
    allow_http = s3.allow_http or bool(_flag(environ, "AWS_ALLOW_HTTP"))
    anonymous = s3.anonymous or bool(_flag(environ, "AWS_SKIP_SIGNATURE"))
    keys = _keys(s3, environ)
    profile = None if keys is not None or anonymous else _first(environ, "AWS_PROFILE", "AWS_DEFAULT_PROFILE")
    if profile is not None:
        profile_keys, profile_region, profile_endpoint = _profile(profile[1])
        keys = profile_keys
        if not region and profile_region:
            region_from, region = f"profile {profile[1]}'s region", profile_region
        if not endpoint and profile_endpoint:
            endpoint_from, endpoint = f"profile {profile[1]}'s endpoint_url", profile_endpoint
    if endpoint:
        parsed = urlparse(endpoint)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise InvalidSettings(f"{endpoint_from}={endpoint!r} is not an http:// or https:// URL of an S3 endpoint")
        if parsed.scheme == "http" and not allow_http:
            raise InvalidSettings(
                f"{endpoint_from}={endpoint} is plain HTTP: set AWS_ALLOW_HTTP=true (or FLOE_S3__ALLOW_HTTP=true) to "
                "allow it, or use https://"
            )
    if endpoint and not region:
        region = ENDPOINT_REGION
    if region and not REGION_NAME.fullmatch(region):
        raise InvalidSettings(f"{region_from}={region!r} is not the name of a region (such as us-west-2)")
    virtual_hosted = _flag(environ, "AWS_VIRTUAL_HOSTED_STYLE_REQUEST")
    access_key_id, secret_access_key, session_token = keys if keys is not None else (None, None, None)
    return S3Settings(
        endpoint_url=endpoint or None,
        region=region or None,
        access_key_id=access_key_id,
        secret_access_key=secret_access_key,
        session_token=session_token,
        allow_http=allow_http,
        force_path_style=s3.force_path_style or (bool(endpoint) and virtual_hosted is not True),
        anonymous=anonymous,
    )


def _keys(s3: S3Settings, environ: Mapping[str, str]) -> tuple[str, str, str | None] | None:
    """Keys from floe's settings, else from the environment; None where neither holds a pair."""
    for where, (key_id, secret, token) in (
        ("FLOE_S3__", (s3.access_key_id, s3.secret_access_key, s3.session_token)),
        (
            "AWS_",
            (
                environ.get("AWS_ACCESS_KEY_ID"),
                environ.get("AWS_SECRET_ACCESS_KEY"),
                environ.get("AWS_SESSION_TOKEN"),
            ),
        ),
    ):
        if key_id and secret:
            return key_id, secret, token or None
        if key_id or secret:
            given, missing = (
                ("ACCESS_KEY_ID", "SECRET_ACCESS_KEY") if key_id else ("SECRET_ACCESS_KEY", "ACCESS_KEY_ID")
            )
            raise InvalidSettings(f"{where}{given} is set without {where}{missing}: give both keys, or neither")
    return None


def _profile(name: str) -> tuple[tuple[str, str, str | None], str | None, str | None]:
    """The keys, region and endpoint of AWS profile ``name`` (``~/.aws/config`` and ``credentials``, or the files
    ``AWS_CONFIG_FILE`` and ``AWS_SHARED_CREDENTIALS_FILE`` name)."""
    try:
        import botocore.session
        from botocore.exceptions import BotoCoreError
    except ImportError as error:  # pragma: no cover - botocore comes with floe's dependencies
        raise InvalidSettings(f"AWS_PROFILE={name}: reading AWS profiles needs botocore ({error})") from None
    try:
        session = botocore.session.Session(profile=name)
        credentials = session.get_credentials()
        frozen = credentials.get_frozen_credentials() if credentials is not None else None
        region = session.get_config_variable("region")
        endpoint = session.get_scoped_config().get("endpoint_url")
    except (BotoCoreError, ValueError) as error:
        raise InvalidSettings(f"AWS_PROFILE={name}: {error}") from None
    if frozen is None or not frozen.access_key or not frozen.secret_key:
        raise InvalidSettings(f"AWS_PROFILE={name}: the profile holds no credentials")
    return (frozen.access_key, frozen.secret_key, frozen.token or None), region, endpoint
