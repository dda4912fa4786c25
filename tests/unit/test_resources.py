"""Where the shipped trees are found (multinode.core.resources): in a checkout, the repository's top level; in an
install, inside the package (test_wheel_install.py checks that one against a real wheel)."""

from __future__ import annotations

from pathlib import Path

import pytest

from multinode.core import resources
from multinode.core.errors import UserError

REPO = Path(__file__).resolve().parents[2]


def test_in_a_checkout_the_trees_are_the_repositorys():
    assert resources.package_dir() == REPO / "scripts" / "multinode"
    assert (resources.infra_dir(), resources.docker_dir(), resources.trainer_dir()) == (
        REPO / "infra", REPO / "docker", REPO / "training")


def test_the_installed_place_comes_first(tmp_path, monkeypatch):
    package = tmp_path / "site-packages" / "multinode"
    (package / "trainer").mkdir(parents=True)
    monkeypatch.setattr(resources, "package_dir", lambda: package)
    assert resources.trainer_dir() == package / "trainer"


def test_a_tree_found_nowhere_is_one_line_naming_both_places(tmp_path, monkeypatch):
    package = tmp_path / "lib" / "multinode"
    package.mkdir(parents=True)
    monkeypatch.setattr(resources, "package_dir", lambda: package)
    with pytest.raises(UserError) as err:
        resources.infra_dir()
    assert str(err.value) == (f"multinode's infra/ files are missing (looked in {package / 'infra'} and "
                              f"{tmp_path / 'infra'}); reinstall multinode (pip install --force-reinstall multinode)")
    with pytest.raises(ValueError, match="unknown bundled tree 'bench'"):
        resources.bundled("bench")
