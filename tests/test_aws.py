"""One S3 configuration: floe's ``s3`` settings over the ``AWS_*`` environment over a profile (ingest/_aws.py)."""

from __future__ import annotations

import pytest

from ingest._aws import ENDPOINT_REGION, repository_s3
from ingest.config import S3Settings
from ingest.errors import InvalidSettings
from ingest.storage import Location

MOTO_LIKE = {
    "AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
    "AWS_REGION": "eu-west-3",
    "AWS_ALLOW_HTTP": "true",
    "AWS_ACCESS_KEY_ID": "env-key",
    "AWS_SECRET_ACCESS_KEY": "env-secret",
}


def test_the_aws_environment_alone_configures_every_client():
    resolved = repository_s3(S3Settings(), MOTO_LIKE)
    assert resolved.endpoint_url == "http://127.0.0.1:9000"
    assert resolved.region == "eu-west-3"
    assert resolved.allow_http is True
    assert (resolved.access_key_id, resolved.secret_access_key) == ("env-key", "env-secret")
    assert resolved.force_path_style is True  # a custom endpoint is addressed path-style

    # The table's client is handed the same endpoint and region, explicitly (PyIceberg reads no AWS_* itself).
    location = Location(url="s3://archive/repo", s3=resolved)
    properties = location.file_io_properties()
    assert properties["s3.endpoint"] == "http://127.0.0.1:9000"
    assert properties["s3.region"] == "eu-west-3"
    assert properties["s3.access-key-id"] == "env-key"
    assert properties["s3.force-virtual-addressing"] == "false"


def test_floe_settings_win_over_the_environment():
    floe = S3Settings(
        endpoint_url="https://minio.example:9000", region="garage", access_key_id="k", secret_access_key="s"
    )
    resolved = repository_s3(floe, MOTO_LIKE)
    assert (resolved.endpoint_url, resolved.region) == ("https://minio.example:9000", "garage")
    assert (resolved.access_key_id, resolved.secret_access_key) == ("k", "s")


def test_service_specific_endpoint_and_default_region():
    environ = {"AWS_ENDPOINT_URL": "https://general:1", "AWS_ENDPOINT_URL_S3": "https://s3-only:2"}
    resolved = repository_s3(S3Settings(), environ)
    assert resolved.endpoint_url == "https://s3-only:2"
    assert resolved.region == ENDPOINT_REGION  # never left for PyIceberg to ask AWS about
    assert repository_s3(S3Settings(), {"AWS_DEFAULT_REGION": "ap-south-1"}).region == "ap-south-1"
    virtual = repository_s3(S3Settings(), {**environ, "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": "true"})
    assert virtual.force_path_style is False


def test_aws_itself_without_keys_leaves_the_sdk_chains_alone():
    resolved = repository_s3(S3Settings(), {})
    assert resolved.endpoint_url is None and resolved.region is None
    assert resolved.access_key_id is None and resolved.force_path_style is False


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"AWS_ENDPOINT_URL": "http://127.0.0.1:9000"}, "AWS_ENDPOINT_URL=http://127.0.0.1:9000 is plain HTTP"),
        ({"AWS_ENDPOINT_URL": "127.0.0.1:9000"}, "is not an http:// or https:// URL"),
        ({"AWS_ACCESS_KEY_ID": "only-the-id"}, "AWS_ACCESS_KEY_ID is set without AWS_SECRET_ACCESS_KEY"),
        ({"AWS_REGION": "not a region"}, "AWS_REGION='not a region' is not the name of a region"),
        ({"AWS_PROFILE": "nobody"}, "AWS_PROFILE=nobody"),
    ],
)
def test_settings_a_client_would_read_otherwise_are_refused_in_one_line(environ, message, tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    with pytest.raises(InvalidSettings, match=message.replace("(", r"\(")) as refused:
        repository_s3(S3Settings(), environ)
    assert "\n" not in str(refused.value)


def test_a_profile_gives_keys_region_and_endpoint(tmp_path, monkeypatch):
    (tmp_path / "credentials").write_text("[archive]\naws_access_key_id = pk\naws_secret_access_key = ps\n")
    (tmp_path / "config").write_text("[profile archive]\nregion = eu-north-1\nendpoint_url = https://objects.example\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_REGION", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)
    resolved = repository_s3(S3Settings(), {"AWS_PROFILE": "archive"})
    assert (resolved.access_key_id, resolved.secret_access_key) == ("pk", "ps")
    assert (resolved.region, resolved.endpoint_url) == ("eu-north-1", "https://objects.example")
    # Keys in the environment win over the profile's, as in every AWS SDK.
    both = repository_s3(
        S3Settings(), {"AWS_PROFILE": "archive", "AWS_ACCESS_KEY_ID": "e", "AWS_SECRET_ACCESS_KEY": "s"}
    )
    assert both.access_key_id == "e"
