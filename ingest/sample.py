"""Generate a small, seeded, deterministic sample Earth-observation archive.

:func:`make_archive` writes N Cloud-Optimized GeoTIFF granules over three collections (:data:`COLLECTIONS`), each
with a STAC item, plus one STAC Collection per collection and a root catalog, for ``floe demo``, the tests and the
benchmarks. What it writes, and how to run it: docs/development.md#the-sample-archive.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import rasterio
from rasterio.crs import CRS
from rasterio.transform import Affine
from rasterio.warp import transform as warp_transform

logger = logging.getLogger(__name__)

STAC_VERSION = "1.0.0"
PROJECTION_EXT = "https://stac-extensions.github.io/projection/v2.0.0/schema.json"
EO_EXT = "https://stac-extensions.github.io/eo/v1.1.0/schema.json"
COG_MEDIA_TYPE = "image/tiff; application=geotiff; profile=cloud-optimized"
LICENSE = "CC-BY-4.0"
CATALOG_ID = "sample-archive"
BLOCKSIZE = 128
# Granule datetimes: START + (index * DAY_STEP mod 366) days, so they cover 2024 (a leap year).
START = datetime(2024, 1, 5, 10, 30, tzinfo=UTC)
DAY_STEP = 23
# Footprint edges are densified before reprojection so the lon/lat polygon follows curved edges.
EDGE_SEGMENTS = 8
COORD_DECIMALS = 7
DEM_NODATA = -9999.0


@dataclass(frozen=True)
class CollectionSpec:
    """How the granules of one collection look."""

    id: str
    title: str
    description: str
    epsg: int
    dtype: str
    bands: int
    width: int
    height: int
    nodata: float | None
    overview_resampling: str
    platform: str
    origin: Callable[[int], tuple[float, float]]  # grid position p of the collection -> (x, y) of the top-left corner
    pixel_size: float
    pixels: Callable[[np.random.Generator, int, int], np.ndarray]  # (rng, height, width) -> (bands, h, w)
    optical: bool = False


def _grid(height: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """Row and column coordinates scaled to [0, 1]."""
    rows, cols = np.mgrid[0:height, 0:width]
    return rows / max(height - 1, 1), cols / max(width - 1, 1)


def _smooth(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """A smooth field in about [-1, 1]: a random tilted plane plus a random sine wave."""
    yy, xx = _grid(height, width)
    angle, phase = rng.uniform(0, 2 * np.pi, size=2)
    frequency = rng.uniform(0.5, 2.0)
    plane = xx * np.cos(angle) + yy * np.sin(angle)
    wave = np.sin(2 * np.pi * frequency * (xx + 0.5 * yy) + phase)
    return 0.6 * (plane - plane.mean()) + 0.4 * wave


def _optical_pixels(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """Three bands of surface-reflectance-like uint16 values (scale 10000)."""
    bands = []
    for band in range(3):
        field = 1500 + 600 * band + 1200 * _smooth(rng, height, width) + rng.normal(0, 60, size=(height, width))
        bands.append(np.clip(np.rint(field), 1, 10000).astype(np.uint16))
    return np.stack(bands)


def _dem_pixels(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """Elevation in metres (float32), with a few nodata pixels."""
    field = 900 + 400 * _smooth(rng, height, width) + rng.normal(0, 1.5, size=(height, width))
    elevation = field.astype(np.float32)
    holes = rng.choice(height * width, size=7, replace=False)
    elevation.ravel()[holes] = DEM_NODATA
    return elevation[np.newaxis]


LANDCOVER_CLASSES = np.array([10, 20, 30, 40, 50, 60, 80, 90], dtype=np.uint8)  # ESA WorldCover-like codes


def _landcover_pixels(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """Class codes (uint8) from a quantized smooth field plus noise."""
    field = _smooth(rng, height, width) + rng.normal(0, 0.08, size=(height, width))
    edges = np.linspace(field.min(), field.max(), len(LANDCOVER_CLASSES) + 1)[1:-1]
    return LANDCOVER_CLASSES[np.digitize(field, edges)][np.newaxis]


COLLECTIONS: tuple[CollectionSpec, ...] = (
    CollectionSpec(
        id="sample-optical",
        title="Sample optical",
        description="Synthetic 3-band (red, green, blue) optical granules in UTM zone 33N, 10 m pixels.",
        epsg=32633,
        dtype="uint16",
        bands=3,
        width=256,
        height=256,
        nodata=None,
        overview_resampling="average",
        platform="samplesat-1",
        origin=lambda k: (500_000.0 + 10_000.0 * (k % 8), 5_600_000.0 - 10_000.0 * ((k // 8) % 8)),
        pixel_size=10.0,
        pixels=_optical_pixels,
        optical=True,
    ),
    CollectionSpec(
        id="sample-dem",
        title="Sample DEM",
        description="Synthetic elevation granules in WGS 84 lon/lat over the Alps, 0.001 degree pixels.",
        epsg=4326,
        dtype="float32",
        bands=1,
        width=128,
        height=96,
        nodata=DEM_NODATA,
        overview_resampling="average",
        platform="samplesat-dem",
        origin=lambda k: (round(10.0 + 0.15 * (k % 8), 6), round(47.5 - 0.12 * ((k // 8) % 8), 6)),
        pixel_size=0.001,
        pixels=_dem_pixels,
    ),
    CollectionSpec(
        id="sample-landcover",
        title="Sample land cover",
        description="Synthetic land-cover class granules in Web Mercator over central Europe, 30 m pixels.",
        epsg=3857,
        dtype="uint8",
        bands=1,
        width=200,
        height=200,
        nodata=None,
        overview_resampling="nearest",
        platform="samplesat-lc",
        origin=lambda k: (1_100_000.0 + 7_000.0 * (k % 8), 6_200_000.0 - 7_000.0 * ((k // 8) % 8)),
        pixel_size=30.0,
        pixels=_landcover_pixels,
    ),
)


def _rfc3339(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _granule_datetime(index: int) -> datetime:
    return START + timedelta(days=(index * DAY_STEP) % 366, minutes=(index * 7) % 60)


def _footprint(crs: CRS, transform: Affine, width: int, height: int) -> dict[str, Any]:
    """The raster outline as a counter-clockwise lon/lat GeoJSON Polygon.

    Edges are densified unless the CRS maps axis-aligned rectangles onto lon/lat rectangles
    (EPSG:4326 itself and Web Mercator), where the extra vertices would be collinear.
    """
    segments = 1 if crs.to_epsg() in {4326, 3857} else EDGE_SEGMENTS
    # Pixel-space ring: top-left -> bottom-left -> bottom-right -> top-right (counter-clockwise on a north-up map).
    corners = [(0, 0), (0, height), (width, height), (width, 0)]
    ring_px: list[tuple[float, float]] = []
    for (c0, r0), (c1, r1) in zip(corners, corners[1:] + corners[:1], strict=True):
        for step in range(segments):
            t = step / segments
            ring_px.append((c0 + (c1 - c0) * t, r0 + (r1 - r0) * t))
    xs, ys = zip(*(transform @ point for point in ring_px), strict=True)
    lons, lats = warp_transform(crs, CRS.from_epsg(4326), list(xs), list(ys))
    ring = [[round(lon, COORD_DECIMALS), round(lat, COORD_DECIMALS)] for lon, lat in zip(lons, lats, strict=True)]
    ring.append(ring[0])
    return {"type": "Polygon", "coordinates": [ring]}


def _bbox(geometry: dict[str, Any]) -> list[float]:
    ring = geometry["coordinates"][0]
    lons = [point[0] for point in ring]
    lats = [point[1] for point in ring]
    return [min(lons), min(lats), max(lons), max(lats)]


def _write_json(path: Path, document: dict[str, Any]) -> None:
    path.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")


def _write_granule(out_dir: Path, spec: CollectionSpec, index: int, place: int, seed: int) -> dict[str, Any]:
    """Write granule ``index`` on its collection's grid position ``place``: COG plus STAC item. Returns the item."""
    item_id = f"{spec.id}-{index:04d}"
    item_dir = out_dir / spec.id / item_id
    item_dir.mkdir(parents=True, exist_ok=True)

    rng = np.random.default_rng(seed + index)
    data = spec.pixels(rng, spec.height, spec.width)
    assert data.shape == (spec.bands, spec.height, spec.width) and data.dtype == np.dtype(spec.dtype)
    x0, y0 = spec.origin(place)
    transform = Affine(spec.pixel_size, 0.0, x0, 0.0, -spec.pixel_size, y0)
    crs = CRS.from_epsg(spec.epsg)

    profile: dict[str, Any] = {
        "driver": "COG",
        "width": spec.width,
        "height": spec.height,
        "count": spec.bands,
        "dtype": spec.dtype,
        "crs": crs,
        "transform": transform,
        "compress": "deflate",
        "blocksize": BLOCKSIZE,
        "overview_resampling": spec.overview_resampling,
    }
    if spec.nodata is not None:
        profile["nodata"] = spec.nodata
    tif_path = item_dir / f"{item_id}.tif"
    with rasterio.open(tif_path, "w", **profile) as dst:
        dst.write(data)

    geometry = _footprint(crs, transform, spec.width, spec.height)
    left, top = x0, y0
    right, bottom = transform @ (spec.width, spec.height)
    properties: dict[str, Any] = {
        "datetime": _rfc3339(_granule_datetime(index)),
        "platform": spec.platform,
        "proj:code": f"EPSG:{spec.epsg}",
        "proj:epsg": spec.epsg,
        "proj:shape": [spec.height, spec.width],
        "proj:transform": list(transform)[:6],
        "proj:bbox": [left, bottom, right, top],
    }
    extensions = [PROJECTION_EXT]
    asset: dict[str, Any] = {"href": f"./{item_id}.tif", "type": COG_MEDIA_TYPE, "roles": ["data"]}
    if spec.optical:
        properties["eo:cloud_cover"] = round(float(rng.uniform(0.0, 100.0)), 2)
        extensions.append(EO_EXT)
        asset["eo:bands"] = [{"name": name, "common_name": name} for name in ("red", "green", "blue")]

    item = {
        "type": "Feature",
        "stac_version": STAC_VERSION,
        "stac_extensions": extensions,
        "id": item_id,
        "collection": spec.id,
        "geometry": geometry,
        "bbox": _bbox(geometry),
        "properties": properties,
        "assets": {"data": asset},
        "links": [
            {"rel": "collection", "href": "../collection.json", "type": "application/json"},
            {"rel": "parent", "href": "../collection.json", "type": "application/json"},
            {"rel": "root", "href": "../../catalog.json", "type": "application/json"},
        ],
    }
    _write_json(item_dir / f"{item_id}.json", item)
    logger.debug("wrote %s", tif_path)
    return item


def _collection(spec: CollectionSpec, items: list[dict[str, Any]]) -> dict[str, Any]:
    bboxes = [item["bbox"] for item in items]
    datetimes = sorted(item["properties"]["datetime"] for item in items)
    return {
        "type": "Collection",
        "stac_version": STAC_VERSION,
        "stac_extensions": [],
        "id": spec.id,
        "title": spec.title,
        "description": spec.description,
        "license": LICENSE,
        "extent": {
            "spatial": {
                "bbox": [
                    [
                        min(b[0] for b in bboxes),
                        min(b[1] for b in bboxes),
                        max(b[2] for b in bboxes),
                        max(b[3] for b in bboxes),
                    ]
                ]
            },
            "temporal": {"interval": [[datetimes[0], datetimes[-1]]]},
        },
        "summaries": {"platform": [spec.platform], "proj:code": [f"EPSG:{spec.epsg}"]},
        "links": [
            {"rel": "root", "href": "../catalog.json", "type": "application/json"},
            {"rel": "parent", "href": "../catalog.json", "type": "application/json"},
            *(
                {"rel": "item", "href": f"./{item['id']}/{item['id']}.json", "type": "application/geo+json"}
                for item in items
            ),
        ],
    }


def make_archive(out_dir: Path, granules: int = 40, seed: int = 0, places: int | None = None) -> list[Path]:
    """Write ``granules`` COG granules with STAC items, collections and a catalog under ``out_dir``.

    Granule ``i`` belongs to collection ``COLLECTIONS[i % 3]``; collections that get no
    granule (``granules < 3``) are not written. Existing files are overwritten; files
    from earlier runs with more granules are left alone.

    Args:
        places: how many grid positions each collection's granules take in turn: the ``k``-th granule of a
            collection lies where its ``k % places``-th would, so from the ``places + 1``-th on each is a
            repeat acquisition of an earlier grid on another date (a time series, as a satellite's revisits
            make). ``None``: every granule on a position of its own (64 positions a collection, then
            they repeat too).

    Returns:
        The item JSON paths, sorted.

    Raises:
        ValueError: ``granules`` or ``places`` is below 1, or ``seed`` is negative.
    """
    if granules < 1:
        raise ValueError(f"granules must be at least 1, got {granules}")
    if places is not None and places < 1:
        raise ValueError(f"places must be at least 1, got {places}")
    if seed < 0:
        raise ValueError(f"seed must be non-negative, got {seed}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)

    items: dict[str, list[dict[str, Any]]] = {spec.id: [] for spec in COLLECTIONS}
    paths: list[Path] = []
    for index in range(granules):
        spec = COLLECTIONS[index % len(COLLECTIONS)]
        k = index // len(COLLECTIONS)  # the k-th granule of its collection
        item = _write_granule(out_dir, spec, index, k % places if places else k, seed)
        items[spec.id].append(item)
        paths.append(out_dir / spec.id / item["id"] / f"{item['id']}.json")

    written = [spec for spec in COLLECTIONS if items[spec.id]]
    for spec in written:
        _write_json(out_dir / spec.id / "collection.json", _collection(spec, items[spec.id]))
    catalog = {
        "type": "Catalog",
        "stac_version": STAC_VERSION,
        "stac_extensions": [],
        "id": CATALOG_ID,
        "title": "Sample archive",
        "description": f"Synthetic sample Earth-observation archive: {granules} COG granules, seed {seed}.",
        "links": [
            {"rel": "root", "href": "./catalog.json", "type": "application/json"},
            *(
                {
                    "rel": "child",
                    "href": f"./{spec.id}/collection.json",
                    "type": "application/json",
                    "title": spec.title,
                }
                for spec in written
            ),
        ],
    }
    _write_json(out_dir / "catalog.json", catalog)
    logger.info("wrote %d granules in %d collections to %s", granules, len(written), out_dir)
    return sorted(paths)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=(
            "Write a seeded, deterministic sample EO archive: Cloud-Optimized GeoTIFF granules with "
            "STAC items in OUT_DIR/<collection>/<item_id>/, a collection.json per collection and "
            "OUT_DIR/catalog.json. Same seed, same bytes."
        )
    )
    parser.add_argument("out_dir", type=Path, metavar="OUT_DIR", help="directory to write the archive into")
    parser.add_argument("--granules", type=int, default=40, help="number of granules (default: 40)")
    parser.add_argument("--seed", type=int, default=0, help="random seed for pixel values (default: 0)")
    parser.add_argument(
        "--places",
        type=int,
        default=None,
        help="grid positions each collection's granules take in turn, so later granules revisit a grid on "
        "another date (default: every granule on a position of its own)",
    )
    args = parser.parse_args(argv)
    if args.granules < 1:
        parser.error("--granules must be at least 1")
    if args.places is not None and args.places < 1:
        parser.error("--places must be at least 1")
    if args.seed < 0:
        parser.error("--seed must be non-negative")
    paths = make_archive(args.out_dir, granules=args.granules, seed=args.seed, places=args.places)
    collections = len({path.parent.parent.name for path in paths})
    print(
        f"wrote {len(paths)} granules in {collections} collections to {args.out_dir} (seed {args.seed})",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
