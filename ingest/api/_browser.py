"""STAC Browser on every ref of `floe serve`: one build, mounted at ``/browser/`` and ``/refs/{ref}/browser/``.

:func:`install_browser` (``floe browser install``) builds STAC Browser once, outside the repository;
:class:`BrowserMount` serves that build at every mount, with the mount's own ``config.js`` (:func:`config_script`)
written per request. How it is built and served: docs/stac-api.md#stac-browser-on-every-ref.
"""

from __future__ import annotations

import json
import mimetypes
import os
import shutil
import subprocess
import tarfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import orjson
from starlette.concurrency import run_in_threadpool
from starlette.responses import FileResponse, RedirectResponse, Response
from starlette.types import Receive, Scope, Send

from ingest.errors import BrowserInstallFailed
from ingest.repository import Repository

VERSION = "4.0.1"
"""The STAC Browser release ``floe browser install`` builds."""
PACKAGE = f"@radiantearth/stac-browser@{VERSION}"
PINNED = {"ol-stac": "1.1.0"}
"""Dependencies the release's own ranges resolve to versions that do not build together: ``ol-stac`` must be exactly
1.1.0 (1.6.0 imports names ``ol`` 10.6 lacks)."""
STAMP = "floe-browser.json"
"""Written into the build last: a build without it is unfinished."""
SCOPE_SERVER_ROOT = "floe.server_root"
"""The ASGI scope key the ref router sets: the server's own root path (before any ``/refs/{ref}``)."""
_CONFIG_TAG_COMMENTED = '<!-- <script defer="defer" src="/config.js"></script> -->'
_CONFIG_TAG = '<script defer="defer" src="./config.js"></script>'
_BASEMAPS_CONFIG = """// floe: the basemaps come from config.js at run time (floe's api.basemaps), not from the build.
export default function configureBasemap() {
  const config = window.STAC_BROWSER_CONFIG || {};
  const basemaps = Array.isArray(config.floeBasemaps) ? config.floeBasemaps : [];
  return basemaps.map((options, index) => Object.assign({ visible: index === 0 }, options));
}
"""


def browser_home(repository_settings: Any) -> Path:
    """Where the build lives: ``api.browser_dir``, else ``~/.cache/floe/stac-browser/<version>``.

    Args:
        repository_settings: floe's settings (what is read is ``api.browser_dir``).

    Returns:
        ``api.browser_dir`` (``~`` expanded), else ``floe/stac-browser/<version>`` under ``$XDG_CACHE_HOME``
        (default: ``~/.cache``); the folder may not exist.
    """
    configured = repository_settings.api.browser_dir
    if configured:
        return Path(configured).expanduser()
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "floe" / "stac-browser" / VERSION


def installed_build(home: Path) -> Path | None:
    """The finished build under ``home`` (its ``dist`` folder), or None.

    Args:
        home: where the build lives (:func:`browser_home`).

    Returns:
        ``home/dist`` if it holds ``index.html`` and the stamp :func:`install_browser` writes last, else None.
    """
    dist = home / "dist"
    return dist if (dist / STAMP).is_file() and (dist / "index.html").is_file() else None


def install_browser(home: Path, *, force: bool = False, say: Callable[[str], None] = print) -> Path:
    """Fetch, patch and build STAC Browser under ``home``; returns the build. Idempotent unless ``force``.

    Needs Node.js and npm (and the npm registry). About 3 minutes and 1 GB
    of ``node_modules`` while building (in ``home/build``, removed once
    built); the build kept is about 6 MB. The output of npm goes to
    ``home/install.log``.

    Args:
        home: where the build goes (:func:`browser_home`).
        force: build again even if a finished build is there.
        say: called with each line of progress (default: ``print``).

    Returns:
        The finished build, ``home/dist``.

    Raises:
        BrowserInstallFailed: npm is not on the PATH, a step (fetching, installing its dependencies, building)
            failed (the message names it, its exit status and the log's last lines), or the release fetched is
            not the one floe patches.
    """
    built = installed_build(home)
    if built is not None and not force:
        say(f"STAC Browser {VERSION} is already built at {built}")
        return built
    npm = shutil.which("npm")
    if npm is None:
        raise BrowserInstallFailed("building STAC Browser needs Node.js and npm (18 or newer) on the PATH")
    work = home / "build"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    log = home / "install.log"
    log.write_text("")

    def step(what: str, command: list[str], cwd: Path, env: dict[str, str] | None = None) -> None:
        say(what)
        started = time.monotonic()
        with log.open("a") as out:
            out.write(f"$ {' '.join(command)}\n")
            out.flush()
            # npm, found on the PATH, with floe's own arguments.
            done = subprocess.run(  # noqa: S603
                command, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, check=False
            )
        if done.returncode != 0:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
            raise BrowserInstallFailed(f"{what} failed (exit {done.returncode}); see {log}:\n{tail}")
        say(f"  done in {time.monotonic() - started:.0f} s")

    step(f"fetching {PACKAGE}", [npm, "pack", PACKAGE, "--pack-destination", str(work)], work)
    (archive,) = work.glob("*.tgz")
    with tarfile.open(archive) as tar:
        tar.extractall(work, filter="data")
    source = work / "package"
    _patch(source)
    step("installing its dependencies (npm install)", [npm, "install", "--no-audit", "--no-fund"], source)
    # vue-cli reads SB_* environment variables as STAC Browser's options. Hash history and relative paths (with the
    # runtime config.js that _patch enables) make one build serve every mount.
    env = {
        **os.environ,
        "SB_historyMode": "hash",
        "SB_pathPrefix": "./",
        "SB_noSourceMaps": "true",
        "SB_catalogTitle": "floe",
    }
    step("building it (npm run build)", [npm, "run", "build"], source, env)
    dist = home / "dist"
    shutil.rmtree(dist, ignore_errors=True)
    (source / "dist").rename(dist)
    (dist / STAMP).write_text(json.dumps({"version": VERSION, "pinned": PINNED, "built": time.time()}))
    shutil.rmtree(work, ignore_errors=True)
    size = sum(path.stat().st_size for path in dist.rglob("*") if path.is_file())
    say(f"STAC Browser {VERSION} built at {dist} ({size / 1e6:.1f} MB)")
    return dist


def _patch(source: Path) -> None:
    """Pin what must be pinned, enable the runtime config.js, and read basemaps from it."""
    manifest_path = source / "package.json"
    manifest = json.loads(manifest_path.read_text())
    manifest.setdefault("dependencies", {}).update(PINNED)
    manifest["overrides"] = {**manifest.get("overrides", {}), **PINNED}
    manifest_path.write_text(json.dumps(manifest, indent=2))
    index = source / "public" / "index.html"
    html = index.read_text()
    if _CONFIG_TAG_COMMENTED not in html:
        raise BrowserInstallFailed(f"{index} has no commented-out config.js tag: is this STAC Browser {VERSION}?")
    index.write_text(html.replace(_CONFIG_TAG_COMMENTED, _CONFIG_TAG))
    (source / "basemaps.config.js").write_text(_BASEMAPS_CONFIG)


def config_script(
    catalog_url: str, refs: list[dict[str, str]], current: str, basemaps: list[dict[str, Any]], title: str
) -> str:
    """One mount's ``config.js``: STAC Browser's options, then the version switcher.

    STAC Browser's ``src/config.js`` merges ``window.STAC_BROWSER_CONFIG`` over its built-in options. The catalog
    URL is the mount's API root (the root's ``self`` link, same origin); the basemaps (``floeBasemaps``) are read at
    run time by floe's ``basemaps.config.js``, ``[]`` showing maps without a basemap. The switcher lists the
    branches and tags, each linking to its own ``/refs/{ref}/browser/``.
    """
    options = {
        "catalogUrl": catalog_url,
        "catalogTitle": title,
        "historyMode": "hash",
        "pathPrefix": "./",
        "allowExternalAccess": False,
        "floeBasemaps": basemaps,
    }
    data = {"refs": refs, "current": current}
    return (
        f"window.STAC_BROWSER_CONFIG = {_js(options)};\n"
        f"window.FLOE_VERSIONS = {_js(data)};\n"
        """(function () {
  function add() {
    var versions = window.FLOE_VERSIONS;
    var box = document.createElement("div");
    box.id = "floe-versions";
    box.setAttribute("style", "position:fixed;right:12px;bottom:12px;z-index:10000;background:#fff;" +
      "border:1px solid #ccc;border-radius:4px;padding:4px 8px;font:13px sans-serif;box-shadow:0 1px 4px #0003");
    var label = document.createElement("label");
    label.appendChild(document.createTextNode("Version "));
    var select = document.createElement("select");
    select.id = "floe-version";
    versions.refs.forEach(function (ref) {
      var option = document.createElement("option");
      option.value = ref.href;
      option.textContent = ref.label;
      option.selected = ref.name === versions.current;
      select.appendChild(option);
    });
    select.addEventListener("change", function () { window.location.href = select.value; });
    label.appendChild(select);
    box.appendChild(label);
    document.body.appendChild(box);
  }
  if (document.body) { add(); } else { document.addEventListener("DOMContentLoaded", add); }
})();
"""
    )


def _js(value: Any) -> str:
    # JSON is JavaScript; "</" is escaped so the text can never close a script element it is pasted into.
    return orjson.dumps(value).decode().replace("</", "<\\/")


class BrowserMount:
    """The ASGI application at ``[/refs/{ref}]/browser/``: the build's files and this mount's ``config.js``."""

    def __init__(self, repository: Repository, resolve_ref: Callable[[Scope], str]) -> None:
        self.repository = repository
        self.home = browser_home(repository.settings)
        self.ref_of = resolve_ref
        """The ref a request's mount names (the default branch at ``/browser/``)."""
        self._build: Path | None = None

    def build(self) -> Path | None:
        """The build, looked up until one is found (then kept: every page request serves files from it)."""
        if self._build is None:
            self._build = installed_build(self.home)
        return self._build

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        root = scope.get("root_path", "")
        path = scope["path"]
        relative = path[len(root) :] if root and path.startswith(root) else path
        # A mount's config.js lists the repository's refs: blocking I/O, off the event loop.
        response = await run_in_threadpool(self._answer, scope, root, relative)
        await response(scope, receive, send)

    def _answer(self, scope: Scope, root: str, relative: str) -> Response:
        if scope["method"] not in ("GET", "HEAD"):
            return Response("STAC Browser's pages are read only", status_code=405, headers={"Allow": "GET, HEAD"})
        if relative == "":
            return RedirectResponse(f"{root}/", status_code=308)
        dist = self.build()
        if dist is None:
            return Response(
                f"STAC Browser is not installed here. Run `floe browser install` (needs Node.js and npm; about 3 "
                f"minutes), then restart `floe serve`. The build goes to {self.home}. The STAC API works without it.\n",
                status_code=404,
                media_type="text/plain",
            )
        if relative == "/config.js":
            return self._config(scope, root)
        name = relative.lstrip("/") or "index.html"
        target = (dist / name).resolve()
        if not target.is_relative_to(dist.resolve()) or not target.is_file():
            return Response(f"no such file: {name}", status_code=404, media_type="text/plain")
        media_type = mimetypes.guess_type(target.name)[0] or "application/octet-stream"
        # Built files have content hashes in their names; the page itself must be fetched again.
        cache = "no-cache" if target.name == "index.html" else "public, max-age=86400"
        return FileResponse(target, media_type=media_type, headers={"Cache-Control": cache})

    def _config(self, scope: Scope, root: str) -> Response:
        host = dict(scope.get("headers") or []).get(b"host", b"").decode() or "localhost"
        origin = f"{scope.get('scheme', 'http')}://{host}"
        api_root = root.removesuffix("/browser")
        server_root = scope.get(SCOPE_SERVER_ROOT, "")
        current = self.ref_of(scope)
        refs = [
            {
                "name": ref.name,
                "label": f"{ref.name} ({ref.kind})",
                "href": f"{server_root}/refs/{quote(ref.name, safe='')}/browser/",
            }
            for ref in self.repository.refs()
        ]
        if current not in {ref["name"] for ref in refs}:
            refs.append(
                {"name": current, "label": f"{current} (snapshot)", "href": f"{server_root}/refs/{current}/browser/"}
            )
        script = config_script(
            catalog_url=f"{origin}{api_root}/",
            refs=refs,
            current=current,
            basemaps=self.repository.settings.api.basemaps,
            title=f"floe: {current}",
        )
        return Response(script, media_type="text/javascript", headers={"Cache-Control": "no-cache"})
