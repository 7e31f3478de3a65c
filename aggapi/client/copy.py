"""pods/copy (KEP-4582) from the client side: stat, download, upload (the public names;
the work is in :mod:`~aggapi.client.downloader`, :mod:`~aggapi.client.uploader` and
:mod:`~aggapi.client.uploaddir`, their vocabulary in :mod:`~aggapi.client.remote`).

Every request goes to the ``/watch/`` form of the path, which kube-apiserver
treats as long-running, so a large copy is not cut at 60 s (RBAC there checks
verb ``watch``; aggapi itself checks get/create on pods/copy).

Downloads verify the whole file's sha256 and resume with ``Range``/``If-Range``
after a cut connection, and across runs through the partial file kept beside the
destination. They ask for the digest after the data (``digest=trailer``: the agent
reads the file once); an agent that predates it sends ``X-Aggapi-Sha256`` up front.
Directories arrive as a PAX tar and are extracted by :mod:`aggapi.client.extract`.
Uploads carry the sha256 (a file's after its bytes, hashed as they are sent; a tar's,
each file's data in its own entry and the rest as the headers digest of
:mod:`aggapi.tar.entrydigest`) so the server refuses to commit anything else, and
compare the server's reply.
"""

from aggapi.client.downloader import decode_stat, download, response_sha256, stat_remote
from aggapi.client.remote import NoProgress, Progress, RateLimit, RemotePath, Result
from aggapi.client.uploaddir import PackedDir, build_first, pack_dir, upload_dir
from aggapi.client.uploader import open_source, upload_file

__all__ = ["NoProgress", "PackedDir", "Progress", "RateLimit", "RemotePath", "Result",
           "build_first", "decode_stat", "download", "open_source", "pack_dir",
           "response_sha256", "stat_remote", "upload_dir", "upload_file"]
