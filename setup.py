"""The compiled parts: the per-file loops of a directory copy, each optional.

- ``aggapi.client._fastextract``: the ncp client's extraction of a directory download
  (aggapi.client.fastpath);
- ``aggapi.agent.copy._fastuntar``: the agent's extraction of a tar upload
  (aggapi.agent.copy.fastuntar);
- ``aggapi.tar._fastheader``: the tar writer's header blocks (aggapi.tar.stream), for the
  agent's directory downloads and ncp's uploads.
The image compiles the agent's two in its own build stage (the Dockerfile's "compile"),
since its wheel is built by the host's Python.

Optional: a machine without a C compiler builds aggapi without them (setuptools warns)
and both sides use their Python paths. AGGAPI_PURE_PYTHON=1 leaves them out on purpose:
the image's wheel (built by the host's Python for the image's) and the kubectl plugin
archives (one zipapp for every platform) are pure Python.
"""

import os

from setuptools import Extension, setup

pure = os.environ.get("AGGAPI_PURE_PYTHON", "") not in ("", "0")
setup(ext_modules=[] if pure else [
    Extension(name, [src], depends=["aggapi/tar/_ustar.h"], optional=True,
              extra_compile_args=["-O2", "-Wall"])
    for name, src in [("aggapi.client._fastextract", "aggapi/client/_fastextract.c"),
                      ("aggapi.agent.copy._fastuntar", "aggapi/agent/copy/_fastuntar.c"),
                      ("aggapi.tar._fastheader", "aggapi/tar/_fastheader.c"),
                      ("aggapi.agent.copy._fastwalk", "aggapi/agent/copy/_fastwalk.c")]
])
