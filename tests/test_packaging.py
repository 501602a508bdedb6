"""floe installed from its wheel, not from the checkout, runs `floe demo` (issue 49, item 5): the wheel carries
the package and the data it reads (configs/, schemas/: pyproject's data-files), and the installed package finds
them under its prefix's share/floe/.

The wheel is built with pip (as `pip install .` would build it) and installed with ``--no-deps --prefix`` into a
new virtual environment; the dependencies come from this checkout's environment through a path entry (its
site-packages, whose .pth files, the editable install of floe among them, are not read), so nothing is
downloaded. Every command then runs in a folder outside the checkout.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

CHECKOUT = Path(__file__).resolve().parents[1]


def run(command: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, f"{command} exited {done.returncode}:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.mark.slow
def test_floe_installed_from_its_wheel_runs_the_demo_outside_the_checkout(tmp_path):
    wheels = tmp_path / "wheels"
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(wheels), str(CHECKOUT)], tmp_path)
    wheel = next(wheels.glob("floe-*.whl"))

    environment = tmp_path / "env"
    run([sys.executable, "-m", "venv", "--without-pip", str(environment)], tmp_path)
    python = environment / "bin" / "python"
    installed = Path(
        run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], tmp_path).stdout.strip()
    )
    (installed / "floe-dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    # --ignore-installed: pip would otherwise uninstall the floe of the environment it runs in (this checkout's
    # editable install) before installing into the prefix.
    install = [sys.executable, "-m", "pip", "install", "--no-deps", "--ignore-installed", "--quiet"]
    run([*install, "--prefix", str(environment), str(wheel)], tmp_path)

    clean = {
        name: value
        for name, value in os.environ.items()
        if name not in ("PYTHONPATH",) and not name.startswith("FLOE_")
    }
    where = run(
        [str(python), "-c", "import ingest, ingest.config as c; print(ingest.__file__); print(c.DEFAULT_CONFIG_FILE)"],
        tmp_path,
        clean,
    )
    package, config = where.stdout.split()
    assert Path(package).is_relative_to(installed), package  # the wheel's package, not the checkout's
    assert Path(config) == environment / "share" / "floe" / "configs" / "default.toml"

    work = tmp_path / "work"
    work.mkdir()
    demo = run([str(python), "-m", "ingest.cli", "demo", "--granules", "6", "--workers", "1"], work, clean)
    assert "tagged the result v1" in demo.stderr, demo.stderr
    search = run([str(python), "-m", "ingest.cli", "search", "--ref", "v1", "--max-items", "2"], work, clean)
    assert len(search.stdout.splitlines()) == 2
    # This checkout's own install is untouched.
    assert (Path(sys.executable).parent / "floe").exists()
    run([sys.executable, "-c", "from importlib.metadata import version; version('floe')"], tmp_path)
