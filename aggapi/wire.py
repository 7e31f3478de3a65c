"""The wire contract between client, apiserver and agent, in one place.

Names here are on the wire: changing one breaks a deployed peer, so each is
defined once and imported by all three sides (and the tests).
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from aggapi import GROUP, VERSION

GROUP_VERSION_PATH = f"/apis/{GROUP}/{VERSION}"

# --- capability operations: what a signed token allows the agent to do ---------
OP_PROGRESS = "imagepullprogress"
OP_NODE_PULLS = "imagepulls"
OP_COPY_STAT = "copy.stat"
OP_COPY_DOWNLOAD = "copy.download"
OP_COPY_UPLOAD = "copy.upload"
# The leader tells a node the other nodes' pulls on its link (issue 37 item 3).
OP_LINK_PEERS = "linkpeers"
OPERATIONS = frozenset({OP_PROGRESS, OP_NODE_PULLS, OP_COPY_STAT, OP_COPY_DOWNLOAD,
                        OP_COPY_UPLOAD, OP_LINK_PEERS})

# --- agent endpoints ---------------------------------------------------------------
AGENT_PROGRESS_PATH = "/v1/imagepullprogress"
AGENT_NODE_PULLS_PATH = "/v1/imagepulls"
AGENT_COPY_PATH = "/v1/copy"
AGENT_LINK_PEERS_PATH = "/v1/linkpeers"
# (method, path) on the agent -> the operation its capability must name.
AGENT_OPERATIONS: dict[tuple[str, str], str] = {
    ("GET", AGENT_PROGRESS_PATH): OP_PROGRESS,
    ("GET", AGENT_NODE_PULLS_PATH): OP_NODE_PULLS,
    ("HEAD", AGENT_COPY_PATH): OP_COPY_STAT,
    ("GET", AGENT_COPY_PATH): OP_COPY_DOWNLOAD,
    ("POST", AGENT_COPY_PATH): OP_COPY_UPLOAD,
    ("PUT", AGENT_LINK_PEERS_PATH): OP_LINK_PEERS,
}


# --- progress: what the apiserver vouches for in the token -----------------------
# When the pod's own finished pulls began, as kubelet's Pulled events tell it (the
# node's clock): {"<index of the container in the token>": epoch milliseconds}, JSON,
# in the capability's params only (never the query). An agent that did not watch a
# pull counts a present layer of that container's image whose snapshot was committed
# since as brought by it (Done), as the stream that watched it said. Indexes keep the
# token small (the agent's header limit is 8 KiB) and name only the token's own.
PARAM_PULLS_BEGAN = "pullsBegan"
PULLS_BEGAN_MAX_BYTES = 4096
PULLS_BEGAN_AHEAD_MS = 86_400_000  # a start may be at most a day past the agent's clock


def encode_pulls_began(began: Mapping[int, float]) -> str:
    return json.dumps({str(i): int(t * 1000) for i, t in sorted(began.items())},
                      separators=(",", ":"))


def decode_pulls_began(raw: str, containers: int, now: float) -> dict[int, float]:
    """{container index: epoch seconds}; ValueError naming what is wrong: not a JSON
    object of integers by index, an index not below ``containers``, or a time before
    1970 or a day past ``now``."""
    if len(raw) > PULLS_BEGAN_MAX_BYTES:
        raise ValueError(f"{PARAM_PULLS_BEGAN} is over {PULLS_BEGAN_MAX_BYTES} bytes")
    try:
        got = json.loads(raw)
    except ValueError:
        raise ValueError(f"{PARAM_PULLS_BEGAN} is not JSON") from None
    if not isinstance(got, dict):
        raise ValueError(f"{PARAM_PULLS_BEGAN} must be an object")
    out: dict[int, float] = {}
    for key, ms in got.items():
        if not (key.isascii() and key.isdigit() and len(key) <= 4
                and int(key) < containers):
            raise ValueError(f"{PARAM_PULLS_BEGAN} names {key!r}, not a container of the "
                             "capability")
        if type(ms) is not int or not 0 < ms <= now * 1000 + PULLS_BEGAN_AHEAD_MS:
            raise ValueError(f"{PARAM_PULLS_BEGAN}[{key!r}] must be epoch milliseconds "
                             "up to a day from now")
        out[int(key)] = ms / 1000
    return out


def copy_operation(method: str) -> str:
    """The copy operation an HTTP method performs (HEAD stats, GET reads, POST writes)."""
    return {"HEAD": OP_COPY_STAT, "GET": OP_COPY_DOWNLOAD, "POST": OP_COPY_UPLOAD}[method]


# --- copy query parameters -------------------------------------------------------
PARAM_CONTAINER = "container"
PARAM_PATH = "path"
# Download: a path that is a symlink is answered with the link itself (its stat, no
# body) only with symlink=keep (as cp -P); otherwise 409, so that nobody takes a link
# for the file (issue 24: app.conf -> .ssh/id_ed25519 uploaded back).
PARAM_SYMLINK = "symlink"
SYMLINK_KEEP = "keep"
# Upload parameters the agent acts on; the apiserver vouches for them in the token.
UPLOAD_PARAMS = ("overwrite", "mode", "uid", "gid", "sha256", "format")
# Upload parameters the agent may take from the query alone: they only restrict.
QUERY_ONLY_UPLOAD_PARAMS = frozenset({"sha256"})
# sha256=trailer: the body's last 32 bytes are the raw sha256 of the bytes before them
# (the client hashes while it sends: one pass over the file). Agents that predate it
# refuse the value (not 64 hex digits) before they write anything.
SHA256_TRAILER = "trailer"
SHA256_TRAILER_SIZE = 32
# A tar upload (format=tar) whose every regular file carries its AGGAPI.sha256 record
# may claim the headers digest instead (aggapi.tar.entrydigest): each file's data is
# hashed once, for its record, not again for the whole tar. ``headers:<hex>`` gives it
# up front, ``headers-trailer`` as the trailer. Agents that predate it refuse both (not
# 64 hex digits) before they write anything, and the client falls back to the above.
SHA256_HEADERS_PREFIX = "headers:"
SHA256_HEADERS_TRAILER = "headers-trailer"
# What every agent answers a sha256 value it does not know, before it writes anything.
SHA256_REFUSED = "sha256 must be 64 hex digits"
# Download: digest=trailer asks for a file's body as data + the raw sha256 of the WHOLE
# file (SHA256_TRAILER_SIZE bytes, counted in Content-Length; on a 206 too, so a resume
# is verified end to end). The agent says it did with X-Aggapi-Sha256: trailer; one
# that predates it ignores the parameter and answers with the digest up front.
PARAM_DIGEST = "digest"
DIGEST_TRAILER = "trailer"
# digest=entry: a file's sha256 up front (X-Aggapi-Sha256, as without the parameter); a
# directory's tar with each file's in its own entry (AGGAPI.sha256). A directory asked
# without ``digest`` is a plain tar: no AGGAPI.* record, no closing "./" entry.
DIGEST_ENTRY = "entry"
# Download parameters the apiserver passes to the agent as they are (not in the token).
DOWNLOAD_CHOICES = (PARAM_SYMLINK, PARAM_DIGEST)
# Every query parameter a copy request may carry, by method (HEAD is GET without its
# body, so it takes GET's). Any other is a 400 naming it, at the apiserver and again at
# the agent, as kube-apiserver refuses an unknown field under strict validation: a
# misspelled overwite=false must not overwrite.
COPY_PARAMS: dict[str, tuple[str, ...]] = {
    "GET": (PARAM_CONTAINER, PARAM_PATH, *DOWNLOAD_CHOICES),
    "HEAD": (PARAM_CONTAINER, PARAM_PATH, *DOWNLOAD_CHOICES),
    "POST": (PARAM_CONTAINER, PARAM_PATH, *UPLOAD_PARAMS),
}
# Parameters kube-apiserver's clients add for kube-apiserver itself, not for the copy:
# client-go (kubectl --request-timeout, also with get/create --raw) sends timeout=<d>.
# The apiserver accepts and ignores them; they never reach the agent.
CLIENT_PARAMS = ("timeout",)


def copy_query_problem(method: str, names: list[str], *,
                       also: tuple[str, ...] = ()) -> str | None:
    """Why a copy request's query parameter names (each as often as it came) are
    refused, or None: one unknown to ``method`` (``also``: the caller's extra ones),
    or one given more than once (which of them would be acted on?)."""
    known = (*COPY_PARAMS.get(method, ()), *also)
    unknown = sorted({n for n in names if n not in known})
    if unknown:
        return (f"unknown query parameter{'s' if len(unknown) > 1 else ''} "
                f"{', '.join(repr(n) for n in unknown)} for {method} on pods/copy "
                f"(known: {', '.join(known)})")
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        return (f"query parameter{'s' if len(repeated) > 1 else ''} "
                f"{', '.join(repr(n) for n in repeated)} given more than once")
    return None

# --- copy headers ------------------------------------------------------------------
HEADER_STAT = "X-Aggapi-Stat"      # base64 JSON {name, size, mode, mtime, uid, gid, ...}
HEADER_SHA256 = "X-Aggapi-Sha256"  # hex sha256 of the whole file, also on 206
HEADER_DIGEST = "Digest"           # RFC 3230: sha-256=<base64>
HEADER_REPR_DIGEST = "Repr-Digest"  # RFC 9530: sha-256=:<base64>:
# Agent response headers the apiserver relays to the client.
RELAYED_HEADERS = ("Content-Length", "Content-Type", "Content-Range", "Accept-Ranges",
                   "ETag", "Last-Modified", HEADER_DIGEST, HEADER_REPR_DIGEST, HEADER_STAT,
                   HEADER_SHA256, "Retry-After")
# Agent headers an error Status keeps through the relay (Retry-After has its own field):
# a 416 says the file's size in Content-Range (bytes */SIZE, RFC 9110 section 15.5.17).
RELAYED_ERROR_HEADERS = ("Content-Range",)
# Request headers the apiserver forwards to the agent on a copy.
FORWARDED_HEADERS = ("Range", "If-Range")

# --- CRI labels kubelet puts on sandboxes and containers ---------------------------
LABEL_POD_UID = "io.kubernetes.pod.uid"
LABEL_POD_NAME = "io.kubernetes.pod.name"
LABEL_POD_NAMESPACE = "io.kubernetes.pod.namespace"
LABEL_CONTAINER_NAME = "io.kubernetes.container.name"
