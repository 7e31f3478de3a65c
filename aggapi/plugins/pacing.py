"""When image-pull-progress counts a pull as stalled.

A module of its own, without imports, so the plugin's --help can quote the numbers
without loading the client (aiohttp) or the renderer (rich).
"""

STALL_SECONDS = 30.0  # no new bytes for this long while downloading: Stalled
