"""The generated shardcoord.v1 stubs (protoc's Python output and grpc_python_plugin's).

They are looked up in $SHARDCOORD_PY_STUBS (a directory holding shardcoord_pb2.py), else in
this package's _gen/ directory: setup.py generates it into an installed package
(`pip install --no-build-isolation ./client/python`), `tools/python.sh` into the checkout
(and refreshes it when proto/shardcoord.proto changes). Both are generated with
--proto_path=proto, so the modules are the top-level `shardcoord_pb2` and
`shardcoord_pb2_grpc`.
"""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def _stubs_dir():
    for path in (os.environ.get("SHARDCOORD_PY_STUBS", ""), os.path.join(_HERE, "_gen")):
        if path and os.path.exists(os.path.join(path, "shardcoord_pb2.py")):
            return path
    raise ImportError(
        "shardcoord: no generated stubs (shardcoord_pb2.py) in $SHARDCOORD_PY_STUBS or "
        f"{os.path.join(_HERE, '_gen')}; run tools/python.sh once (it generates them with "
        "protoc and grpc_python_plugin from protobuf-compiler-grpc)")


_dir = _stubs_dir()
if _dir not in sys.path:
    sys.path.insert(0, _dir)

import shardcoord_pb2 as pb  # noqa: E402  pylint: disable=wrong-import-position
import shardcoord_pb2_grpc as pb_grpc  # noqa: E402  pylint: disable=wrong-import-position

__all__ = ["pb", "pb_grpc"]
