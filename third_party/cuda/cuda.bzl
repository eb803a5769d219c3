"""cuda_library: compiles .cu files with nvcc into a cc_library.

Bazel 4 has no CUDA rules offline, so nvcc runs in a genrule per source and the objects go
into a cc_library. Only used where @local_config_cuda found the toolkit.
"""

load("@local_config_cuda//:defs.bzl", "CUDA_ROOT")

# Hopper (H100/H200) plus a PTX fallback for anything newer.
_NVCC_FLAGS = "-std=c++17 -O3 -Xcompiler -fPIC -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90"

def cuda_library(name, srcs, hdrs = [], nvcc_hdrs = [], deps = [], **kwargs):
    """nvcc_hdrs: headers of other packages the sources include (their cc_library in deps)."""
    objs = []
    for src in srcs:
        stem = src.rsplit(".", 1)[0]
        obj = "_%s_%s.pic.o" % (name, stem.replace("/", "_"))
        native.genrule(
            name = "_%s_%s_nvcc" % (name, stem.replace("/", "_")),
            srcs = [src] + hdrs + nvcc_hdrs,
            outs = [obj],
            cmd = "%s/bin/nvcc %s -I. -I$(GENDIR) -Iexternal/local_config_cuda/include -c $(location %s) -o $@" % (CUDA_ROOT, _NVCC_FLAGS, src),
        )
        objs.append(obj)
    native.cc_library(
        name = name,
        srcs = objs,
        hdrs = hdrs,
        deps = deps + ["@local_config_cuda//:cuda"],
        **kwargs
    )
