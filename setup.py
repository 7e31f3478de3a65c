"""The one compiled part: the ncp client's per-file extraction loop (aggapi.client.fastpath).

Optional: a machine without a C compiler builds aggapi without it (setuptools warns) and
the client uses its Python path. AGGAPI_PURE_PYTHON=1 leaves it out on purpose: the image
(whose servers do not use it; its wheel is built by the host's Python for the image's) and
the kubectl plugin archives (one zipapp for every platform) are pure Python.
"""

import os

from setuptools import Extension, setup

pure = os.environ.get("AGGAPI_PURE_PYTHON", "") not in ("", "0")
setup(ext_modules=[] if pure else [
    Extension("aggapi.client._fastextract", ["aggapi/client/_fastextract.c"],
              optional=True, extra_compile_args=["-O2", "-Wall"]),
])
