"""Repository rule that detects the CUDA toolkit and NCCL at /usr/local/cuda.

Generates @local_config_cuda with:
  - defs.bzl: CUDA_AVAILABLE (nvcc, cuda_runtime.h, nccl.h and libnccl.so all present) and
    CUDA_ROOT, so BUILD files build the NCCL backend only where the toolkit is installed;
  - //:cuda (CUDA runtime headers + libcudart) and //:nccl, over symlinks into the toolkit, so
    Bazel sees the headers as declared inputs.
Where the toolkit is missing, the targets exist but are empty and CUDA_AVAILABLE is False.
"""

_BUILD_AVAILABLE = """
package(default_visibility = ["//visibility:public"])

cc_library(
    name = "cuda",
    hdrs = glob(["include/**/*.h", "include/**/*.hpp", "include/**/*.inl", "include/**/*.cuh"]),
    includes = ["include"],
    linkopts = ["-L{root}/lib64", "-Wl,-rpath,{root}/lib64", "-lcudart"],
)

cc_library(
    name = "nccl",
    linkopts = ["-L{root}/lib64", "-Wl,-rpath,{root}/lib64", "-lnccl"],
    deps = [":cuda"],
)
"""

_BUILD_MISSING = """
package(default_visibility = ["//visibility:public"])

cc_library(name = "cuda")

cc_library(name = "nccl")
"""

def _cuda_configure_impl(ctx):
    root = ctx.os.environ.get("CUDA_HOME", "/usr/local/cuda")
    needed = ["bin/nvcc", "include/cuda_runtime.h", "include/nccl.h", "lib64/libnccl.so", "lib64/libcudart.so"]
    available = True
    for f in needed:
        if not ctx.path(root + "/" + f).exists:
            available = False
    if available:
        ctx.symlink(root + "/include", "include")
        ctx.file("BUILD.bazel", _BUILD_AVAILABLE.format(root = root))
    else:
        ctx.file("BUILD.bazel", _BUILD_MISSING)
    ctx.file("defs.bzl", "CUDA_AVAILABLE = %s\nCUDA_ROOT = \"%s\"\n" % (available, root))

cuda_configure = repository_rule(
    implementation = _cuda_configure_impl,
    environ = ["CUDA_HOME"],
    local = True,
)
