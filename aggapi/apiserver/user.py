"""The authenticated identity of a request (k8s.io/apiserver's user.Info).

:class:`UserInfo` lives in aggapi.auth.delegated (the agent's metrics port uses it too).
"""

from __future__ import annotations

from aiohttp import web

from aggapi.auth.delegated import ANONYMOUS, AUTHENTICATED, UserInfo

__all__ = ["ANONYMOUS", "AUTHENTICATED", "UNAUTHENTICATED", "USER", "UserInfo", "anonymous"]

UNAUTHENTICATED = "system:unauthenticated"

# Set by the authentication middleware on every request it lets through.
USER: web.RequestKey[UserInfo] = web.RequestKey("user", UserInfo)


def anonymous() -> UserInfo:
    return UserInfo(ANONYMOUS, "", (UNAUTHENTICATED,))
