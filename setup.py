"""The package list (the rest of the metadata is in pyproject.toml).

``adapters/`` and ``conf/`` sit at the top of the repository but install inside the ``perseus``
namespace (``perseus.adapters``, ``perseus.conf``): a top-level ``adapters`` package would clobber
an unrelated PyPI package. Every folder below the three roots, data folders included, is found
here and listed as a package, so that a new subpackage needs no entry and setuptools installs the
data folders without "Package would be ignored" warnings.
"""

from setuptools import find_namespace_packages, setup

SKIP = ["*.__pycache__", "*.__pycache__.*"]


def packages_under(folder: str, name: str) -> list:
    """``name`` and every folder below ``folder``, named inside ``name``."""
    found = find_namespace_packages(where=folder, exclude=SKIP)
    return [name] + [f"{name}.{sub}" for sub in found]


setup(
    packages=find_namespace_packages(include=["perseus", "perseus.*"], exclude=SKIP)
    # Hydra finds plugins in the ``hydra_plugins`` namespace package (no __init__.py).
    + find_namespace_packages(include=["hydra_plugins", "hydra_plugins.*"], exclude=SKIP)
    + packages_under("adapters", "perseus.adapters")
    + packages_under("conf", "perseus.conf"),
    package_dir={"perseus.adapters": "adapters", "perseus.conf": "conf"},
)
