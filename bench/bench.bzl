"""The benches' two kinds: cluster_bench starts its own coordinator and workers through
//tests:cluster; fake_workers_bench runs the coordinator's plan logic in-process
(:coordinator_logic) with fake workers."""

def cluster_bench(name, data = [], deps = []):
    """A cc_binary from `<name>.cc` with what every such bench needs.

    Args:
      name: the bench; its source is `<name>.cc`.
      data: runfiles besides the coordinator and worker binaries the cluster starts.
      deps: libraries besides bench_common, the client, the cluster, tensor checks, the JSON
        writer and absl.
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
            "//bench:bench_common",
            "//client:coordinator_client",
            "//common:json_writer",
            "//tests:cluster",
            "//tests:tensor_check",
            "//third_party:absl",
        ],
    )

def fake_workers_bench(name, deps = []):
    """A cc_binary from `<name>.cc` with what every such bench needs.

    Args:
      name: the bench; its source is `<name>.cc`.
      deps: libraries besides bench_common, coordinator_logic, the managers it composes, fake
        worker reports, absl and the coordinator's allocator.
    """
    native.cc_binary(
        name = name,
        testonly = True,  # Fake worker reports.
        srcs = [name + ".cc"],
        deps = deps + [
            "//bench:bench_common",
            "//bench:coordinator_logic",
            "//coordinator/cluster:worker_client",
            "//coordinator/cluster:worker_manager",
            "//coordinator/plans:plan_manager",
            "//coordinator/state:tensor_manager",
            "//coordinator/testing:fake_reports",
            "//third_party:absl",
            "//third_party:tcmalloc",  # The coordinator's allocator.
        ],
    )
