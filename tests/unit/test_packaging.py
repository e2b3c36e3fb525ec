"""What `pip install kvops` gets: the wheel holds every data file the packages read, and a plan runs from it.

A checkout (and the editable install the suite runs on) reads the data files from the tree, so a file the wheel
leaves out fails only for users: the vLLM option tables once did (`kvops plan` raised FileNotFoundError)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.support.extras import INSTALL
from tests.support.paths import REPO

PACKAGES = (REPO / "kvops", REPO / "plugins" / "kvops_vllm")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel built from a copy of the sources alone (a build/ folder left in the checkout would lend it files)."""
    pytest.importorskip("setuptools", minversion="68", reason=f"setuptools>=68 not installed ({INSTALL})")
    source, out = tmp_path_factory.mktemp("source"), tmp_path_factory.mktemp("wheel")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    for package in PACKAGES:
        shutil.copytree(package, source / package.relative_to(REPO), ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(source)],
        check=True,
        capture_output=True,
    )
    [built] = out.glob("kvops-*.whl")
    return built


def shipped_files() -> set[str]:
    """Every file of the packages but caches, relative to the folder the package sits in."""
    return {
        str(path.relative_to(package.parent))
        for package in PACKAGES
        for path in package.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    }


def test_the_wheel_holds_every_file_of_the_packages(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = sorted(shipped_files() - names)
    assert not missing, f"the wheel leaves out {', '.join(missing)}: add them to [tool.setuptools.package-data]"


def test_a_plan_runs_from_the_installed_wheel(wheel, tmp_path, run_kvops):
    zipfile.ZipFile(wheel).extractall(tmp_path / "site")
    script = (
        "import sys; sys.path.insert(0, sys.argv[1]); import kvops; from kvops.cli import main; "
        "print(kvops.__file__, file=sys.stderr); "
        "main(['plan', '-m', 'llama-3.1-8b', '--gpu', 'L4', '--max-model-len', '8192', '--json'])"
    )
    result = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "site")], capture_output=True, text=True, cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr.startswith(str(tmp_path / "site"))
    from_checkout = run_kvops("plan", "-m", "llama-3.1-8b", "--gpu", "L4", "--max-model-len", "8192", "--json")
    assert json.loads(result.stdout) == json.loads(from_checkout.stdout)
