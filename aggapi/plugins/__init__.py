"""The kubectl plugins (kubectl-ncp, kubectl-image_pull_progress).

They need the ``plugins`` extra (rich for the progress bars); the servers do not,
so a bare ``pip install aggapi`` leaves it out. Say so instead of a bare
ModuleNotFoundError deep in a traceback.
"""

import importlib.util

if importlib.util.find_spec("rich") is None:
    raise ImportError("the kubectl plugins need the 'plugins' extra: "
                      "pip install 'aggapi[plugins]'")
