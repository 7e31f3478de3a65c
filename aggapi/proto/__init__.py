"""Generated gRPC stubs (hack/gen-proto.sh) for the CRI v1 subset and the containerd
services aggapi uses. Do not edit the *_pb2*.py files; edit the .proto and regenerate.
"""
