#!/usr/bin/env bash
# Create .venv with Python 3.12+ and install floe (editable) with its test tools.
# Idempotent: a second run only checks that everything is installed.
set -euo pipefail
cd "$(dirname "$0")/.."

find_python() {
  for candidate in "${PYTHON:-}" python3.12 python3.13 python3 python; do
    [ -n "$candidate" ] || continue
    command -v "$candidate" >/dev/null 2>&1 || continue
    if "$candidate" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 12) else 1)' 2>/dev/null; then
      echo "$candidate"; return 0
    fi
  done
  for candidate in "$HOME"/.pyenv/versions/3.1[2-9]*/bin/python; do
    [ -x "$candidate" ] && { echo "$candidate"; return 0; }
  done
  echo "floe needs Python 3.12 or newer (icechunk 2.x requires it); set PYTHON=/path/to/python3.12" >&2
  return 1
}

if [ ! -x .venv/bin/python ]; then
  python_bin=$(find_python)
  echo "creating .venv with $("$python_bin" --version)" >&2
  "$python_bin" -m venv .venv
fi
echo "installing floe and its test and benchmark tools into .venv (pip; minutes the first time, seconds after)" >&2
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[test,bench]' 2> >(grep -v "^WARNING: Location" >&2)

# STAC Browser (`floe serve` at /browser/): a third-party build kept outside the repository
# (~/.cache/floe/stac-browser/<version>); built once where Node.js and npm are present, then reused.
if command -v npm >/dev/null 2>&1; then
  echo "building STAC Browser for floe serve (npm; about 3 minutes the first time, then reused)" >&2
  .venv/bin/floe browser install \
    || echo "STAC Browser could not be built (see above): floe serve works without it; its tests are skipped" >&2
else
  echo "npm is missing: STAC Browser is not built (floe serve answers the API without it)" >&2
fi

# Chromium renders STAC Browser in the tests (tests/api/test_browser.py), driven by Playwright.
if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
  as_root=""
  [ "$(id -u)" = 0 ] || as_root="sudo -n"
  echo "installing Debian's chromium for the browser tests" >&2
  $as_root apt-get install -y --no-install-recommends chromium >/dev/null 2>&1 \
    || { $as_root apt-get update >/dev/null 2>&1 && $as_root apt-get install -y --no-install-recommends chromium >/dev/null; } \
    || echo "could not install chromium (needs root): tests/api/test_browser.py will fail" >&2
fi
