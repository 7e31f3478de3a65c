"""tests.framework.release: the pull Secret the add-on is installed with."""

from __future__ import annotations

import base64
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.framework.release import RegistryLogin

_text = st.text(st.characters(codec="utf-8", exclude_characters=":\x00"), min_size=1,
                max_size=40)


@settings(max_examples=50, deadline=None, derandomize=True)
@given(user=_text, password=st.text(st.characters(codec="utf-8"), min_size=1, max_size=60))
def test_pull_secret_carries_the_login_as_kubelet_reads_it(user: str, password: str) -> None:
    login = RegistryLogin("10.251.0.1:5001", user, password)
    secret = login.pull_secret("aggapi-registry", "aggapi")
    assert secret["type"] == "kubernetes.io/dockerconfigjson"
    data = secret["data"]
    assert isinstance(data, dict)
    cfg = json.loads(base64.b64decode(data[".dockerconfigjson"]))
    (host, entry), = cfg["auths"].items()
    assert host == login.host
    # kubelet takes "auth" (base64 of user:password) first, else username and password.
    assert base64.b64decode(entry["auth"]).decode() == f"{user}:{password}"
    assert (entry["username"], entry["password"]) == (user, password)
