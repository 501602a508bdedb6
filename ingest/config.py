"""One settings object for floe.

Values come, in order of precedence, from explicit keyword arguments (the CLI
passes its flags this way), ``FLOE_*`` environment variables (nested fields with
``__``, e.g. ``FLOE_S3__ENDPOINT_URL``), a TOML file named by ``FLOE_CONFIG``,
and ``configs/default.toml``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlparse

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from ingest._resources import resource

REGION_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")
"""What an S3 region's name looks like (``us-west-2``, ``eu-central-1``, a server's own such as ``garage``): it goes
into hosts and signatures, so nothing else is taken for one (a setting, or a server's answer)."""

HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,256}")
"""An HTTP field name (RFC 9110 ``token``)."""

HEADER_VALUE = re.compile(r"[\t\x20-\x7e\x80-\xff]{0,8192}")
"""An HTTP field value: visible characters, spaces and tabs; never a line break (which would start another header)."""

DEFAULT_CONFIG_FILE = resource("configs/default.toml")


class S3Settings(BaseModel):
    """How to reach an S3-compatible object store for ``s3://`` roots."""

    endpoint_url: str | None = None
    region: str | None = None
    access_key_id: str | None = None
    secret_access_key: str | None = None
    session_token: str | None = None
    allow_http: bool = False
    force_path_style: bool = False
    anonymous: bool = False

    def given(self) -> bool:
        """Whether any setting differs from the defaults (else the ``AWS_*`` environment alone applies)."""
        return self != S3Settings()


class RemoteSettings(BaseModel):
    """How objects named by URL are read (files and folders of items, remote rasters, ``check --deep``),
    besides the S3 credentials in :class:`S3Settings`. The repository's own storage is not concerned, nor are
    STAC API searches, whose pages take their own time to make (pystac-client under urllib3's retries:
    ``ingest.pipeline.sources._api_io.TIMEOUT`` and ``RETRIES``)."""

    model_config = ConfigDict(hide_input_in_errors=True)  # a refused header's value is a credential

    # s3:// prefixes read unsigned, without credentials (public buckets): "s3://sentinel-cogs/" (a bucket),
    # "s3://bucket/public/" (a prefix of one), "s3://" (every bucket; what `floe ingest --anonymous` adds).
    anonymous: list[str] = Field(default_factory=list)
    # Seconds to connect, and without a byte received before a read counts as stalled (then it is retried).
    connect_timeout_s: float = Field(default=30.0, gt=0)
    read_timeout_s: float = Field(default=30.0, gt=0)
    # Retries of a request that failed transiently (a timeout, a dropped connection, a 5xx), with exponential
    # backoff, and the longest all of one request's retries may take.
    retries: int = Field(default=4, ge=0)
    retry_timeout_s: float = Field(default=180.0, gt=0)
    # The region of buckets outside the one set for everything (s3.region, AWS_REGION), by bucket:
    # {"sentinel-cogs": "us-west-2"}. A bucket not named here has its region asked of S3 once per process (an
    # unsigned HEAD of the bucket, which S3 answers with its region), unless find_regions is false.
    regions: dict[str, str] = Field(default_factory=dict)
    find_regions: bool = True
    # s3:// prefixes (buckets, as a rule) whose requester pays for what it reads (Landsat Collection 2:
    # "s3://usgs-landsat/"): their requests say so, signed. "s3://": every bucket (`floe ingest --requester-pays`).
    requester_pays: list[str] = Field(default_factory=list)
    # Azure Blob Storage containers that refuse anonymous reads are read with SAS tokens from this service:
    # GET {sas_token_url}/{account}/{container} answers {"token": ..., "msft:expiry": ...}. `floe ingest
    # --planetary-computer` sets Planetary Computer's (https://planetarycomputer.microsoft.com/api/sas/v1/token).
    # Tokens are asked for when needed, renewed before they expire, and never written anywhere.
    sas_token_url: str | None = None
    # Sent to the token service as Ocp-Apim-Subscription-Key (Planetary Computer's optional subscription key).
    # Set it in the environment (FLOE_REMOTE__SAS_SUBSCRIPTION_KEY), not in a file that is shared.
    sas_subscription_key: str | None = None
    # Blob endpoints addressed path-style (Azurite, Azure Stack), as host:port: their URLs are
    # http(s)://host:port/{account}/{container}/{blob}.
    blob_path_style: list[str] = Field(default_factory=list)
    # A STAC API search is read in this many lanes at once (one search per collection where it names several, per
    # interval of its time where it names one): the API makes a page of each while the others travel (paging one
    # search is serial). 1: a search is read as one. Unset: 3, or 1 for an API on a loopback host (it shares the
    # ingest's cores; set it for a tunnel to one far away).
    search_lanes: int | None = Field(default=None, ge=1)
    # HTTP headers sent to URL prefixes only (an API key, a bearer token): {"https://api.example.com/":
    # {"Authorization": "Bearer ..."}}. A request gets those of every prefix it starts with; no other request
    # gets them. `floe ingest --header 'Name: value'` adds one for the http(s) sources it names. Credentials:
    # set them in the environment (FLOE_REMOTE__HEADERS='{...}'), not in a file that is shared.
    headers: dict[str, dict[str, str]] = Field(default_factory=dict)

    @field_validator("headers")
    @classmethod
    def _headers(cls, values: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
        for prefix, headers in values.items():
            parsed = urlparse(prefix)
            if parsed.scheme not in ("http", "https") or not parsed.netloc:
                raise ValueError(f"headers: {prefix!r} is not an http(s):// URL prefix")
            for name, value in headers.items():
                if not HEADER_NAME.fullmatch(name):
                    raise ValueError(f"headers for {prefix}: {name!r} is not an HTTP header name")
                if not HEADER_VALUE.fullmatch(value):
                    raise ValueError(
                        f"headers for {prefix}: the value of {name} holds a line break or control character"
                    )
        return values

    @field_validator("sas_token_url")
    @classmethod
    def _token_service(cls, value: str | None) -> str | None:
        if value is None or value == "":
            return None
        parsed = urlparse(value)
        if parsed.scheme not in ("http", "https") or not parsed.netloc or parsed.query:
            raise ValueError(f"sas_token_url {value!r} is not an http(s):// URL without a query")
        return value.rstrip("/")

    @field_validator("blob_path_style")
    @classmethod
    def _hosts(cls, values: list[str]) -> list[str]:
        for value in values:
            if not value or "/" in value or "?" in value:
                raise ValueError(f"blob_path_style: {value!r} is not a host[:port] (no scheme, no path)")
        return [value.lower() for value in values]

    @field_validator("anonymous", "requester_pays")
    @classmethod
    def _prefixes(cls, values: list[str]) -> list[str]:
        prefixes = []
        for value in values:
            if not value.startswith("s3://"):
                raise ValueError(f"prefix {value!r} is not an s3:// URL (only S3 requests are signed)")
            # "s3://bucket" names the bucket, not every bucket whose name starts so.
            prefixes.append(value if value == "s3://" or value.endswith("/") else value + "/")
        return prefixes

    @field_validator("regions")
    @classmethod
    def _regions(cls, values: dict[str, str]) -> dict[str, str]:
        for bucket, region in values.items():
            if not bucket or "/" in bucket or ":" in bucket:
                raise ValueError(f"regions: {bucket!r} is not a bucket name (name the bucket alone, no s3://)")
            if not REGION_NAME.fullmatch(region):
                raise ValueError(f"regions: {region!r} (bucket {bucket}) is not a region name such as us-west-2")
        return values


class CommitSettings(BaseModel):
    """The rebase-and-reconcile loop and the shape of table metadata."""

    max_attempts: int = Field(default=100, ge=1)
    backoff_initial_ms: float = Field(default=2.0, ge=0)
    backoff_max_ms: float = Field(default=100.0, ge=0)
    # Icechunk keeps the history; each Iceberg metadata.json keeps only this many snapshots.
    snapshot_log: int = Field(default=4, ge=1)


class ApiSettings(BaseModel):
    """The STAC API server (`floe serve`) and the search engine behind it and `floe search`."""

    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    # Processes `floe serve` answers from (one socket; each its own caches). Unset: the cores floe may use.
    workers: int | None = Field(default=None, ge=1)
    # Largest page a search returns. A larger limit gets max_limit items (OGC API Features: "SHALL NOT result in
    # an error"), or, with refuse_over_limit, a 400 that says so.
    max_limit: int = Field(default=10_000, ge=1)
    refuse_over_limit: bool = False
    # A filter naming a property no item has matches nothing, as in pgstac and the other stac-fastapi backends
    # (and stac-api-validator expects); with refuse_unknown_properties, a 400 names the property instead and
    # /queryables says `additionalProperties: false` (a typo then cannot read like an empty answer).
    refuse_unknown_properties: bool = False
    # Decoded columns of data files kept in memory across requests (data files never change).
    cache_mb: int = Field(default=256, ge=0)
    # A directory where the table's objects read from object storage (metadata, data files up to 1 MiB) are kept
    # by URL, shared by every process naming it (`floe serve --workers N`, a replica that restarts, each `floe
    # search`): they are never fetched twice. Unset: nothing is kept on disk. A local root needs none.
    cache_dir: str | None = None
    # What cache_dir may hold; the least recently used objects go first.
    cache_dir_mb: int = Field(default=2048, ge=1)
    # Long searches (past their first quarter second or 64 data files) a worker runs at once; the others wait
    # for a turn, so short searches never queue behind a crowd of them. 0: no limit.
    long_searches: int = Field(default=1, ge=0)
    # Largest request body (a POST search) read; a larger one is answered 413 before it is parsed.
    max_body_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)
    # The token a write through the Transactions extension (`floe serve --transactions`) must carry as
    # `Authorization: Bearer <token>`; without one, --transactions is refused. Set it in the environment
    # (FLOE_API__WRITE_TOKEN), not in a file that is shared.
    write_token: str | None = Field(default=None, repr=False)
    # Where `floe browser install` builds STAC Browser and `floe serve` finds it (default:
    # ~/.cache/floe/stac-browser/<version>; outside the repository: it is a third-party build).
    browser_dir: str | None = None
    # Basemaps of STAC Browser's maps, as its basemaps.config.js options (`url`, `is`, `title`, `attributions`,
    # `projection`, ...); [] shows maps without one (what a machine without internet access wants).
    basemaps: list[dict[str, Any]] = Field(
        default_factory=lambda: [
            {
                "url": "https://tile.openstreetmap.org/{z}/{x}/{y}.png",
                "is": "XYZ",
                "title": "OpenStreetMap",
                "attributions": (
                    '&copy; <a href="https://www.openstreetmap.org/copyright">OpenStreetMap</a> contributors'
                ),
                "projection": "EPSG:3857",
            }
        ]
    )


class OptimizeSettings(BaseModel):
    """Compaction of the items table (`floe optimize`, and after each ingest)."""

    # Rows per compacted data file: smaller files prune better, larger ones cost less per row to list.
    target_file_rows: int = Field(default=10_000, ge=1)
    # After an ingest, a partition (collection, month) is compacted once it holds this many batch files
    # (0: never automatically; `floe optimize` still works).
    small_files: int = Field(default=16, ge=0)
    # ... or this many compacted runs of one level (size-tiered: each row is rewritten about once per level).
    fan_in: int = Field(default=4, ge=2)


class ArraysSettings(BaseModel):
    """How granules' rasters become arrays (see ingest/rasters/_stack.py for the layout)."""

    # "tiled": every granule is a window of its lattice (CRS, pixel size, alignment) cut into tiles;
    # "fixed": one stack per exact grid (CRS, transform, shape), which virtual references always use.
    layout: Literal["tiled", "fixed"] = "tiled"
    # With the fixed layout, a copy stores a COG's compressed tiles as its chunks, as they are (no decode and
    # re-encode; each tile is decoded once to check it), where zarr can decode the file's compression and
    # tiling; false: every copy is decoded and re-encoded in `chunk`-sized zstd chunks.
    tile_copy: bool = True
    # Side of a lattice tile, in pixels: a tiled stack is one tile.
    tile: int = Field(default=4096, ge=16)
    # Side of a chunk, in pixels (one slot and one band deep).
    chunk: int = Field(default=512, ge=16)
    # Slots each stack has room for (a chunk never written costs nothing).
    stack_capacity: int = Field(default=1_048_576, ge=1)
    # Icechunk manifests are split every this many slots of a stack (set when a repository is created):
    # a commit rewrites only the newest split of each stack it appends to.
    manifest_split: int = Field(default=1024, ge=1)


class Settings(BaseSettings):
    """Everything floe can be configured with."""

    # A refused value is not repeated in the error: it may be a credential (a header's token, a key).
    model_config = SettingsConfigDict(
        env_prefix="FLOE_", env_nested_delimiter="__", extra="ignore", hide_input_in_errors=True
    )

    root: str = "./floe-data"
    branch: str = "main"
    # Items per commit of `floe ingest` (one data file per collection and month each) ...
    batch_size: int = Field(default=5000, ge=1)
    # ... growing, on object storage, up to this many while commits spend over a quarter of a batch's time
    # waiting on the store (round trips cost per commit, not per item); = batch_size: never grows.
    batch_max_size: int = Field(default=40_000, ge=1)
    # ... or fewer, once the local rasters a batch copies reach this many MB.
    batch_raster_mb: int = Field(default=512, ge=1)
    # Items per commit when they come as rows, not items (local stac-geoparquet, large NDJSON, or a large STAC API
    # search's pages, metadata only: they hold no Python objects, so a commit's fixed cost is spread over more of
    # them); `--batch-size` sets both.
    rows_batch_size: int = Field(default=50_000, ge=1)
    # A metadata backfill with Ray (`floe ingest --assets none`) reads NDJSON files in parts of this many MB, and
    # stac-geoparquet files in runs of rows about as large on disk: an actor reads one part at a time.
    part_mb: float = Field(default=64.0, gt=0)

    @property
    def part_bytes(self) -> int:
        """``part_mb`` in bytes (at least 1)."""
        return max(1, int(self.part_mb * (1 << 20)))

    s3: S3Settings = Field(default_factory=S3Settings)
    remote: RemoteSettings = Field(default_factory=RemoteSettings)
    commit: CommitSettings = Field(default_factory=CommitSettings)
    api: ApiSettings = Field(default_factory=ApiSettings)
    optimize: OptimizeSettings = Field(default_factory=OptimizeSettings)
    arrays: ArraysSettings = Field(default_factory=ArraysSettings)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        files = [path for path in (DEFAULT_CONFIG_FILE, _user_config_file()) if path is not None and path.exists()]
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        # Later files win in TomlConfigSettingsSource, so the user's file goes last.
        if files:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=files))
        return tuple(sources)


def _user_config_file() -> Path | None:
    value = os.environ.get("FLOE_CONFIG")
    return Path(value) if value else None


def load_settings(**overrides: Any) -> Settings:
    """Settings from the files and the environment, with ``overrides`` (None values ignored) on top."""
    return Settings(**{key: value for key, value in overrides.items() if value is not None})
