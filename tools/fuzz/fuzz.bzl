"""cc_fuzz_test: one LLVMFuzzerTestOneInput source and a seed corpus directory.

In the normal build it is a cc_test that runs every seed file through the target once (a fast
regression test, no libFuzzer). With --config=fuzz (clang 14, sanitizers, --define=fuzz=1)
the same target links libFuzzer, and tools/fuzz.sh runs it for a bounded number of runs;
`bazel test --config=fuzz` still only replays the seeds (libFuzzer runs files given as
arguments once each).
"""

def cc_fuzz_test(name, srcs, deps = [], corpus = None, runs = 20000, tags = [], size = "small", **kwargs):
    """A fuzz target and its seed-corpus regression test.

    Args:
      name: the test (and, under --config=fuzz, fuzzer binary) name.
      srcs: sources; one of them defines LLVMFuzzerTestOneInput.
      deps: what the target fuzzes.
      corpus: seed directory in this package; default `<name>_corpus`.
      runs: how many inputs tools/fuzz.sh tries (FUZZ_RUNS_PERCENT scales it); choose it so the
        target takes about ten seconds, slow targets fewer.
      tags: extra tags; "fuzz" is always added (tools/fuzz.sh finds targets by it).
      **kwargs: passed to cc_test.
    """
    corpus = corpus or name + "_corpus"
    native.filegroup(
        name = name + "_seeds",
        testonly = True,
        srcs = native.glob([corpus + "/**"]),
    )
    native.cc_test(
        name = name,
        srcs = srcs,
        deps = deps + select({
            "//tools/fuzz:fuzz_build": [],
            "//conditions:default": ["//tools/fuzz:regression_main"],
        }),
        linkopts = select({
            "//tools/fuzz:fuzz_build": ["-fsanitize=fuzzer"],
            "//conditions:default": [],
        }),
        data = [":" + name + "_seeds"],
        args = ["$(locations :" + name + "_seeds)"],
        size = size,
        # One self-contained binary, so tools/fuzz.sh can run it outside Bazel.
        linkstatic = True,
        tags = tags + ["fuzz", "fuzz_runs=%d" % runs],
        **kwargs
    )
