"""shardcoord: the Python client of the shardcoord sharding coordinator.

    import shardcoord
    c = shardcoord.connect()                      # $SHARDCOORD_ADDR, then 127.0.0.1:7400
                                                  # ("host:port,host:port": follows the leader)
    c.create_mesh("train", [4])
    c.create_tensor("w", shape=[1024, 512], dtype="f32", mesh="train",
                    placements="S(0)", init="attached")
    buf = c.alloc("w", rank, framework="torch")   # shared memory, lent without a copy
    c.attach("w", rank, buf)                      # or any contiguous NumPy / torch buffer
    c.copy("w", "w_infer")                        # w_infer's attached buffers written in place

    # A whole model: created in one call, lent by each rank's process in one request.
    c.register({n: p.shape for n, p in model.named_parameters()}, "train", "fsdp_flat")
    c.lend(rank, local_state_dict)                # {name: this rank's local tensor}
    c.receive(rank, engine_state_dict)            # an engine's tensors, written in place

Needs grpcio, protobuf and NumPy (torch for torch buffers). Installed with
`pip install --no-build-isolation ./client/python` (stubs generated at build time), or run
from a checkout with `tools/python.sh` (see shardcoord/_proto.py). `shardcoord.__version__`
is the daemons' and shardctl's version (client/version.h); `shardcoord.layouts` turns
FSDP/Megatron/ColossalAI/DTensor layouts into shardctl spec text; `python -m shardcoord.check
ADDR` prints a cluster's health. Errors raise shardcoord.Error with `.code`
(the gRPC status name), `.message` and, for calls on many tensors, `.member` (the failing
name).
"""

try:
    from ._version import __version__  # Written by setup.py into an installed package.
except ImportError:
    from ._checkout_version import version as _version

    __version__ = _version()

from ._buffers import DTYPES
from ._errors import Error
from ._proto import pb, pb_grpc
from .client import (LEADER_METADATA, Client, channel_credentials, connect, default_address,
                     default_token, spec)

__all__ = ["Client", "DTYPES", "Error", "LEADER_METADATA", "channel_credentials", "connect",
           "default_address", "default_token", "pb", "pb_grpc", "spec", "__version__"]
