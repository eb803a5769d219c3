"""Repository rule that detects the CUDA toolkit and NCCL at /usr/local/cuda.

Generates @local_config_cuda//:defs.bzl with CUDA_AVAILABLE and the toolkit path, so BUILD
files can build the NCCL backend only where the toolkit is installed.
"""

def _cuda_configure_impl(ctx):
    root = ctx.os.environ.get("CUDA_HOME", "/usr/local/cuda")
    nvcc = ctx.path(root + "/bin/nvcc")
    nccl_h = ctx.path(root + "/include/nccl.h")
    available = nvcc.exists and nccl_h.exists
    ctx.file("BUILD.bazel", "exports_files([\"defs.bzl\"])\n")
    ctx.file("defs.bzl", "CUDA_AVAILABLE = %s\nCUDA_ROOT = \"%s\"\n" % (available, root))

cuda_configure = repository_rule(
    implementation = _cuda_configure_impl,
    environ = ["CUDA_HOME"],
    local = True,
)
