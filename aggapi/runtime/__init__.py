"""Access to the container runtime: CRI v1 and containerd's own gRPC services.

Every call is async (grpc.aio over a unix socket); results are small frozen
dataclasses so callers never hold protobuf objects.
"""
