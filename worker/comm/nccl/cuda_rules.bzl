"""Targets that exist only where @local_config_cuda found the CUDA toolkit and NCCL.

Elsewhere these macros define nothing, so `bazel build //...` and `bazel test //...` skip the
CUDA parts instead of failing. Used by this package and //tests/gpu.
"""

load("@local_config_cuda//:defs.bzl", "CUDA_AVAILABLE")
load("//third_party/cuda:cuda.bzl", "cuda_library")

def if_cuda(then, otherwise = []):
    return then if CUDA_AVAILABLE else otherwise

def cuda_only_cc_library(**kwargs):
    if CUDA_AVAILABLE:
        native.cc_library(**kwargs)

def cuda_only_cc_binary(**kwargs):
    if CUDA_AVAILABLE:
        native.cc_binary(**kwargs)

def cuda_only_cc_test(**kwargs):
    if CUDA_AVAILABLE:
        native.cc_test(**kwargs)

def cuda_only_cuda_library(**kwargs):
    if CUDA_AVAILABLE:
        cuda_library(**kwargs)
