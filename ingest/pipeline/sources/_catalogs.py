"""Static STAC catalogs: a Catalog or Collection named as a source, walked through its links to its collections
and items (pystac), on disk or at a URL.

Only a catalog named as a source is walked: a ``catalog.json`` met in a folder is skipped (its items are read from
the files beside it). At a URL, links resolve against the URL and are read through the object stores
(:class:`StoreStacIO`), and the items' relative asset hrefs become absolute.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pystac

from ingest.errors import InvalidSource
from ingest.pipeline.sources._documents import absolute_hrefs
from ingest.pipeline.sources._types import SourcedItem
from ingest.remote import RemoteError


def local_catalog_items(path: Path) -> Iterator[SourcedItem]:
    """A STAC Catalog or Collection file named as a source: its collections and items, following its links."""
    try:
        root = pystac.read_file(str(path))
    except Exception as error:  # noqa: BLE001 - pystac raises many kinds; all mean "not a readable catalog"
        yield SourcedItem(str(path), error=InvalidSource(f"not a readable STAC catalog ({error})"))
        return
    if not isinstance(root, pystac.Catalog):  # a Collection is a Catalog too
        yield SourcedItem(str(path), error=InvalidSource(f"not a STAC catalog or collection ({type(root).__name__})"))
        return
    for collection in _collections(root):
        yield SourcedItem(collection.self_href or str(path), collection=collection.to_dict(include_self_link=False))
    for item in root.get_items(recursive=True):
        href = item.get_self_href()
        item_file = Path(href) if href and "://" not in href else None
        yield SourcedItem(
            href or str(path), item=item.to_dict(include_self_link=False, transform_hrefs=False), path=item_file
        )


def remote_catalog_items(
    url: str, document: dict[str, Any], read_bytes: Callable[[str], bytes]
) -> Iterator[SourcedItem]:
    """A STAC Catalog or Collection named by URL (``document``, read already): its collections and items,
    following its links, each read with ``read_bytes`` (which raises :class:`~ingest.remote.RemoteError`)."""
    try:
        root = pystac.read_dict(document, href=url, stac_io=StoreStacIO(read_bytes))
    except Exception as error:  # noqa: BLE001 - pystac raises many kinds; all mean "not a readable catalog"
        yield SourcedItem(url, error=InvalidSource(f"not a readable STAC catalog ({error})"))
        return
    if not isinstance(root, pystac.Catalog):  # a Collection is a Catalog too
        yield SourcedItem(url, error=InvalidSource(f"not a STAC catalog or collection ({type(root).__name__})"))
        return
    try:
        for collection in _collections(root):
            collection_url = collection.self_href or url
            collection_dict = collection.to_dict(include_self_link=False)
            absolute_hrefs(collection_dict, collection_url)
            yield SourcedItem(collection_url, collection=collection_dict)
        for item in root.get_items(recursive=True):
            href = item.get_self_href() or url
            item_dict = item.to_dict(include_self_link=False, transform_hrefs=False)
            absolute_hrefs(item_dict, href)
            yield SourcedItem(href, item=item_dict)
    except Exception as error:  # noqa: BLE001 - pystac raises many kinds for a broken child
        remote = _remote_cause(error)
        reason = (
            f"the catalog's link to {remote.url} failed: {remote.reason}"
            if remote is not None
            else f"the catalog could not be walked to its end ({error})"
        )
        yield SourcedItem(url, error=InvalidSource(reason))


def _collections(root: pystac.Catalog) -> list[pystac.Collection]:
    """The catalog itself where it is a Collection, then every collection under it."""
    collections: list[pystac.Collection] = [root] if isinstance(root, pystac.Collection) else []
    return collections + list(root.get_all_collections())


def _remote_cause(error: BaseException | None) -> RemoteError | None:
    """The :class:`RemoteError` behind ``error`` (pystac wraps what a StacIO raises in its own errors)."""
    while error is not None:
        if isinstance(error, RemoteError):
            return error
        error = error.__cause__ or error.__context__
    return None


class StoreStacIO(pystac.StacIO):
    """A ``pystac.StacIO`` that reads through the object stores (so ``s3://`` catalogs walk); never writes."""

    def __init__(self, read_bytes: Callable[[str], bytes]) -> None:
        super().__init__()
        self.read_bytes = read_bytes

    def read_text(self, source: Any, *args: Any, **kwargs: Any) -> str:
        href = str(os.fspath(source))
        data = self.read_bytes(href)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as error:
            raise RemoteError(href, f"not UTF-8 (byte {data[error.start]:#04x})") from error

    def write_text(self, dest: Any, txt: str, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError("floe reads catalogs from URLs; it never writes to them")
