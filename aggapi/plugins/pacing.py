"""How many pods image-pull-progress follows at once and when a pull counts as stalled.

A module of its own, without imports, so the plugin's --help can quote the numbers
without loading the client (aiohttp) or the renderer (rich).
"""

MAX_STREAMS = 50  # progress streams open at once; further pods wait as Queued
STALL_SECONDS = 30.0  # no new bytes for this long while downloading: Stalled
