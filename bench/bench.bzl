"""cluster_bench: a bench that starts its own coordinator and workers through //tests:cluster."""

def cluster_bench(name, data = [], deps = []):
    """A cc_binary from `<name>.cc` with what every such bench needs.

    Args:
      name: the bench; its source is `<name>.cc`.
      data: runfiles besides the coordinator and worker binaries the cluster starts.
      deps: libraries besides the client, the cluster, tensor checks, the JSON writer and absl.
    """
    native.cc_binary(
        name = name,
        testonly = True,  # Starts its cluster through //tests:cluster.
        srcs = [name + ".cc"],
        data = data + [
            "//coordinator",
            "//worker",
        ],
        deps = deps + [
            "//client:coordinator_client",
            "//common:json_writer",
            "//tests:cluster",
            "//tests:tensor_check",
            "//third_party:absl",
        ],
    )
