"""Async Python client for aggapi's pod subresources (imagepullprogress, copy)."""

import aggapi.client.aiohttp_import  # noqa: F401  (first: it imports aiohttp; see why there)
from aggapi.client.connection import Connection, subresource_path
from aggapi.client.copy import RemotePath, Result, download, stat_remote, upload_dir, upload_file
from aggapi.client.errors import (
    AggapiError,
    BadRequest,
    ConfigError,
    Conflict,
    Forbidden,
    InsufficientStorage,
    IntegrityError,
    NotFound,
    ServiceUnavailable,
    TooLarge,
    TooManyRequests,
    TransferError,
    Unauthorized,
    UnsafeArchive,
)
from aggapi.client.progress import all_present, watch_progress

__all__ = [
    "AggapiError", "BadRequest", "ConfigError", "Conflict", "Connection", "Forbidden",
    "InsufficientStorage", "IntegrityError", "NotFound", "RemotePath", "Result",
    "ServiceUnavailable", "TooLarge", "TooManyRequests", "TransferError", "Unauthorized",
    "UnsafeArchive", "all_present", "download", "stat_remote", "subresource_path",
    "upload_dir", "upload_file", "watch_progress",
]
