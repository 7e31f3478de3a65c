#!/usr/bin/env bash
# Generate the gRPC stubs for aggapi/proto/*.proto with grpcio-tools.
# Usage: hack/gen-proto.sh [OUT_DIR]   (default: aggapi/proto, i.e. in place)
# The stubs are committed; tests/runtime/test_proto_fresh.py regenerates into a
# temp dir and fails if the committed ones differ.
set -euo pipefail
cd "$(dirname "$0")/.."
SRC=aggapi/proto
OUT=${1:-$SRC}
mkdir -p "$OUT"
INCLUDE=$(python3 -c 'import grpc_tools, os; print(os.path.join(os.path.dirname(grpc_tools.__file__), "_proto"))')
python3 -m grpc_tools.protoc -I "$SRC" -I "$INCLUDE" \
  --python_out="$OUT" --grpc_python_out="$OUT" --pyi_out="$OUT" "$SRC"/*.proto
# protoc emits top-level imports ("import ctd_types_pb2"); our stubs live in a package.
for f in "$OUT"/*_pb2.py "$OUT"/*_pb2_grpc.py "$OUT"/*_pb2.pyi; do
  sed -i -E 's/^import ([a-z0-9_]+_pb2) as /from . import \1 as /' "$f"
done
