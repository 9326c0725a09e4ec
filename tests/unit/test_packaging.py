"""What ``pip install .`` ships: every package folder of the repository, under the one
``steno`` namespace (pyproject.toml maps the folders onto it)."""

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHIPPED_FOLDERS = ("services", "schemas", "migrations", "infra", "benchmarks")


def _config() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_every_package_folder_is_shipped_under_steno():
    folders = {
        "steno." + ".".join(init.parent.relative_to(ROOT).parts)
        for top in SHIPPED_FOLDERS for init in (ROOT / top).rglob("__init__.py")
        if "__pycache__" not in init.parts
    }
    assert set(_config()["packages"]) == folders


def test_nothing_is_installed_as_a_top_level_module_but_steno():
    config = _config()
    assert {package.split(".")[0] for package in config["packages"]} == {"steno"}
    assert config["package-dir"] == {f"steno.{top}": top for top in SHIPPED_FOLDERS}


def test_what_the_images_import_exists():
    """The images run Python at build time (the Harmony vocabulary, a smoke test); a
    renamed module would break only ``docker build``, which CI cannot run here."""
    import importlib
    import re

    for dockerfile in sorted((ROOT / "infra").glob("Dockerfile*")):
        imports = re.findall(r"from (steno[\w.]*) import (\w+)", dockerfile.read_text())
        assert imports, f"{dockerfile.name} imports nothing of steno"
        for module, name in imports:
            assert hasattr(importlib.import_module(module), name), f"{dockerfile.name}: {module}.{name}"
