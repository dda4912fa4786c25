"""-o ssh_user on local nodes: an existing user, root to serve it; refused in one line naming the value."""

from __future__ import annotations

import pwd

import pytest

from multinode.core.errors import UserError
from multinode.providers.local import provider


def test_an_unknown_user_is_refused_with_the_fix():
    with pytest.raises(UserError, match=r"^-o ssh_user=no-such-user-x: no such user on this machine; create it "
                                        r"\(useradd no-such-user-x\) or leave ssh_user unset$"):
        provider._check_ssh_user("no-such-user-x")


def test_without_root_a_login_user_cannot_be_served(monkeypatch):
    monkeypatch.setattr(provider, "isolated", lambda: False)
    name = pwd.getpwuid(0).pw_name
    with pytest.raises(UserError, match=rf"^-o ssh_user={name} needs root"):
        provider._check_ssh_user(name)


def test_unset_is_the_login_user(monkeypatch):
    monkeypatch.setattr(provider, "login_user", lambda: "ubuntu")
    assert provider._check_ssh_user(None) == "ubuntu"
