"""The first Python client's module, kept for existing scripts: a thin layer over the
`shardcoord` package (client/python/shardcoord), which new code should import instead.

    from shardcoord_client import ShardcoordClient
    c = ShardcoordClient()                      # $SHARDCOORD_ADDR or 127.0.0.1:7400
    c.create_tensor("t", "m", [64, 48], placements="S(0),R", init="arange")

The differences kept here: ShardcoordClient.create_tensor takes (name, mesh, shape, ...) in
that order, errors are ShardcoordError (an alias of shardcoord.Error).
"""

import shardcoord
from shardcoord import channel_credentials, default_address, default_token, pb, pb_grpc

ShardcoordError = shardcoord.Error


class ShardcoordClient(shardcoord.Client):
    """shardcoord.Client with the first module's argument order for create_tensor."""

    def create_tensor(self, name, mesh, shape, dtype="f32", placements=None, flat=None,
                      init="zeros", seed=0):  # pylint: disable=arguments-differ,arguments-renamed
        return super().create_tensor(name, shape, dtype=dtype, mesh=mesh, placements=placements,
                                     flat=flat, init=init, seed=seed)


def connect(address=None, token=None, tls_ca=None, **kwargs):
    """A ShardcoordClient; arguments as shardcoord.connect."""
    return ShardcoordClient(address, token=token, tls_ca=tls_ca, **kwargs)


__all__ = ["ShardcoordClient", "ShardcoordError", "channel_credentials", "connect",
           "default_address", "default_token", "pb", "pb_grpc"]
