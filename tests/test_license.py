"""The repository's LICENSE is the unmodified Apache License 2.0 that pyproject.toml
names (the plugin archives ship this file)."""

from __future__ import annotations

import hashlib
import tomllib

from tests.framework.repo import REPO

# sha256 of the Apache Software Foundation's LICENSE-2.0.txt (md5 3b83ef96387f14655fc854ddc3c6bd57),
# the copy Debian ships as /usr/share/common-licenses/Apache-2.0.
APACHE_2_0_SHA256 = "cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30"


def test_license_is_the_apache_2_0_text() -> None:
    text = (REPO / "LICENSE").read_bytes()
    assert hashlib.sha256(text).hexdigest() == APACHE_2_0_SHA256
    assert text.lstrip().startswith(b"Apache License\n") and b"Version 2.0, January 2004" in text


def test_pyproject_names_the_same_license() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    # Either the table form or a PEP 639 SPDX expression.
    assert project["license"] in ({"text": "Apache-2.0"}, "Apache-2.0")
