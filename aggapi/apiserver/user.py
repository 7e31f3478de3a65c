"""The authenticated identity of a request (k8s.io/apiserver's user.Info)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from aiohttp import web

ANONYMOUS = "system:anonymous"
AUTHENTICATED = "system:authenticated"
UNAUTHENTICATED = "system:unauthenticated"


@dataclass(frozen=True)
class UserInfo:
    name: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: Mapping[str, tuple[str, ...]] = field(default_factory=dict, hash=False)

    @property
    def is_anonymous(self) -> bool:
        return self.name == ANONYMOUS

    def key(self) -> tuple[object, ...]:
        """A hashable identity for caches (extra included)."""
        return (self.name, self.uid, self.groups,
                tuple(sorted((k, tuple(v)) for k, v in self.extra.items())))

    def with_authenticated(self) -> UserInfo:
        """kube-apiserver adds system:authenticated to every authenticated user."""
        if AUTHENTICATED in self.groups:
            return self
        return UserInfo(self.name, self.uid, (*self.groups, AUTHENTICATED), self.extra)


# Set by the authentication middleware on every request it lets through.
USER: web.RequestKey[UserInfo] = web.RequestKey("user", UserInfo)


def anonymous() -> UserInfo:
    return UserInfo(ANONYMOUS, "", (UNAUTHENTICATED,))
