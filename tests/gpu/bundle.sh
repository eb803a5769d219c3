#!/usr/bin/env bash
# Packs what tests/gpu/check.sh runs into one self-contained folder for a GPU machine that has
# a CUDA driver, NCCL and a CUDA torch but neither Bazel nor this project's Debian packages
# (a rented GPU box, a CI runner with a GPU): the GPU tests, nccl_bench, the coordinator and
# worker, their shared libraries (gRPC, protobuf, Abseil, Gloo, ...: every library `ldd`
# resolves except glibc, libstdc++ and the driver's), the Python client with its generated
# stubs, and tests/gpu/bundle_run.sh, which runs them there.
#
#   tests/gpu/bundle.sh DIR          # builds -c opt, fills DIR, writes DIR.tar.xz
#   (on the GPU machine) tar xf DIR.tar.xz && DIR/run.sh OUT_DIR
#
# libnccl.so.2 is not packed (200+ MB): run.sh takes the machine's own (pip's nvidia-nccl,
# /usr/lib, /usr/local/cuda) or $NCCL_LIB_DIR. The binaries need glibc >= this machine's.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:?usage: tests/gpu/bundle.sh DIR}

gpu_tests=(//tests/gpu:kernels_test //tests/gpu:nccl_communicator_gpu_test
  //worker/comm/nccl:device_buffer_test //worker/comm/nccl:cuda_memory_space_test
  //worker/comm/nccl:cuda_status_test //worker/comm/nccl:gpu_probe_test)
tools=(//tests/gpu:nccl_bench //coordinator:coordinator //worker:worker //client:shardctl)

if ! bazel query 'attr(tags, gpu, tests(//tests/gpu/...))' 2>/dev/null | grep -q kernels_test; then
  echo "bundle.sh: this machine has no CUDA toolkit, so Bazel defines no GPU targets" >&2
  exit 1
fi
bazel build -c opt "${gpu_tests[@]}" "${tools[@]}" >&2
bin=$(bazel info -c opt bazel-bin 2>/dev/null)

rm -rf "$out"
mkdir -p "$out/bin" "$out/lib" "$out/python"
built=()
for t in "${gpu_tests[@]}" "${tools[@]}"; do
  path=${t#//}
  built+=("$bin/${path/://}")
done
cp "${built[@]}" "$out/bin/"
chmod u+w "$out"/bin/*
strip --strip-debug "$out"/bin/*

# Every library the binaries resolve where Bazel built them (tests find the project's own
# libraries through a relative rpath into _solib), except the C runtime and the GPU driver's, which
# the GPU machine has in newer versions, and NCCL (see above).
skip='^(linux-vdso|ld-linux|libc\.|libm\.|libdl\.|librt\.|libpthread\.|libstdc\+\+|libgcc_s|libcuda\.|libnccl\.)'
for b in "${built[@]}"; do
  ldd "$b" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}'
done | sort -u | while read -r name path; do
  [[ "$name" =~ $skip ]] && continue
  cp -L "$path" "$out/lib/$name"
done
chmod u+w "$out"/lib/*
strip --strip-unneeded "$out"/lib/* 2>/dev/null || true

bash tools/python.sh --pythonpath >/dev/null  # generates the client's stubs
cp -r client/python/shardcoord "$out/python/"
find "$out/python" -name __pycache__ -prune -exec rm -rf {} +
cp tests/python/cluster.py tests/gpu/attach_check.py tests/gpu/worker_check.py "$out/python/"
# The checks find cluster.py in ../python from their own folder.
sed -i 's|os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python")|os.path.dirname(os.path.abspath(__file__))|' \
  "$out/python/attach_check.py" "$out/python/worker_check.py"
cp tests/gpu/bundle_run.sh "$out/run.sh"
chmod +x "$out/run.sh"

tar -C "$(dirname "$out")" -cJf "$out.tar.xz" "$(basename "$out")"
echo "bundle.sh: $(du -sh "$out" | cut -f1) in $out, $(du -h "$out.tar.xz" | cut -f1) packed in $out.tar.xz" >&2
