#!/usr/bin/env bash
# Builds the shardcoord container image from Debian packages: a bookworm root filesystem with
# mmdebstrap (variant minbase, plus the runtime libraries in packages.txt), the daemons and
# shardctl built by Bazel, CUDA's runtime and NCCL from /usr/local/cuda (the worker links them;
# the NVIDIA driver comes from the node), and a user `shardcoord` (uid 10001). Then imports it
# into podman as an OCI image.
#
#   bash deploy/image/build.sh                    # everything: shardcoord:dev in podman
#   bash deploy/image/build.sh --tag registry.example.com/shardcoord:1.0
#   bash deploy/image/build.sh --rootfs DIR --no-import    # the root filesystem only
#   bash deploy/image/build.sh --context DIR      # a build context for deploy/image/Containerfile
#
# Flags:
#   --tag NAME           image name for podman import (default shardcoord:dev)
#   --out DIR            where the rootfs tarball goes: DIR/shardcoord-rootfs.tar (default
#                        deploy/image/out, ignored by git)
#   --rootfs DIR         also leave the root filesystem unpacked in DIR (replaced)
#   --no-import          do not run podman import (podman is then not needed)
#   --context DIR        only stage the binaries, libraries and packages.txt for the
#                        Containerfile into DIR and stop (no mmdebstrap)
#   --compilation-mode M Bazel -c (default opt; tools/test.sh uses fastbuild to reuse the
#                        test build)
#   --cache DIR          keep the Debian part (it only changes with packages.txt) here and
#                        reuse it (default ~/.cache/shardcoord-image; "" disables)
#
# Needs root (mmdebstrap's root mode), the network to a Debian mirror (apt works), and about
# 1-2 minutes for the Debian part the first time. Installs mmdebstrap (and podman unless
# --no-import) with apt when missing.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD

tag=shardcoord:dev
out=""
rootfs_dir=""
do_import=1
context=""
mode=opt
cache=${HOME:-/root}/.cache/shardcoord-image
while (($#)); do
  case $1 in
    --tag) tag=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --rootfs) rootfs_dir=$2; shift 2 ;;
    --no-import) do_import=0; shift ;;
    --context) context=$2; shift 2 ;;
    --compilation-mode) mode=$2; shift 2 ;;
    --cache) cache=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "build.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

need() {  # need PACKAGE COMMAND: installs PACKAGE with apt when COMMAND is missing.
  if ! command -v "$2" >/dev/null 2>&1; then
    echo "build.sh: installing $1" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$1" >/dev/null
  fi
}

packages=$(grep -v '^#' deploy/image/packages.txt | grep -v '^$' | tr '\n' ' ')

bash tools/setup.sh
echo "build.sh: building the daemons (bazel -c $mode)" >&2
bazel build -c "$mode" //coordinator //worker //client:shardctl >&2
bin=$(bazel info -c "$mode" bazel-bin 2>/dev/null)

# The files the image adds to Debian's, laid out as in the image.
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/usr/local/bin" "$stage/usr/local/cuda/lib64"
install -m 0755 "$bin/coordinator/coordinator" "$stage/usr/local/bin/shardcoord-coordinator"
install -m 0755 "$bin/worker/worker" "$stage/usr/local/bin/shardcoord-worker"
install -m 0755 "$bin/client/shardctl" "$stage/usr/local/bin/shardctl"
for lib in libcudart.so.13 libnccl.so.2; do
  if [[ -e /usr/local/cuda/lib64/$lib ]]; then
    cp -L "/usr/local/cuda/lib64/$lib" "$stage/usr/local/cuda/lib64/"
  fi
done
# Other libraries the binaries link that are not Debian's (none today but CUDA's).
missing=$(ldd "$stage"/usr/local/bin/* | awk '/=>/ && $3 !~ /^\/(usr\/)?lib/ && $3 !~ /^\/usr\/local\/cuda/ {print $1}' | sort -u)
if [[ -n $missing ]]; then
  echo "build.sh: the binaries link libraries that are neither Debian's nor CUDA's: $missing" >&2
  exit 1
fi

if [[ -n $context ]]; then
  rm -rf "$context"
  mkdir -p "$context"
  cp -a "$stage/." "$context/rootfs/"
  cp deploy/image/packages.txt "$context/"
  echo "build.sh: build context in $context; now: podman build -f deploy/image/Containerfile -t $tag $context" >&2
  exit 0
fi

[[ $(id -u) -eq 0 ]] || { echo "build.sh: needs root (mmdebstrap root mode)" >&2; exit 1; }
need mmdebstrap mmdebstrap

# The Debian part, cached by the package list (and this script's Debian options).
key=$( (cat deploy/image/packages.txt; echo "minbase bookworm v1") | sha256sum | cut -c1-16)
base=""
if [[ -n $cache ]]; then
  mkdir -p "$cache"
  base=$cache/debian-$key.tar
fi
if [[ -z $base || ! -s $base ]]; then
  debian=$stage.debian.tar
  echo "build.sh: mmdebstrap bookworm minbase + $packages" >&2
  start=$(date +%s)
  mmdebstrap --quiet --variant=minbase --include="${packages// /,}" \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin' \
    bookworm "$debian"
  echo "build.sh: Debian part built in $(($(date +%s) - start)) s" >&2
  if [[ -n $base ]]; then mv "$debian" "$base"; else base=$debian; fi
fi

# The image: Debian's part, then ours, then the user.
work=$stage.rootfs
rm -rf "$work"
mkdir -p "$work"
tar -C "$work" -xf "$base"
cp -a "$stage/." "$work/"
echo 'shardcoord:x:10001:10001:shardcoord:/var/lib/shardcoord:/usr/sbin/nologin' >>"$work/etc/passwd"
echo 'shardcoord:x:10001:' >>"$work/etc/group"
mkdir -p "$work/var/lib/shardcoord"
chown 10001:10001 "$work/var/lib/shardcoord"
touch "$work/etc/hosts"
# The binaries must find every library inside the image.
for b in shardctl shardcoord-coordinator shardcoord-worker; do
  if ! chroot "$work" "/usr/local/bin/$b" --help >/dev/null; then
    echo "build.sh: $b does not run inside the image" >&2
    exit 1
  fi
done

[[ -n $out ]] || out=$root/deploy/image/out
mkdir -p "$out"
tar -C "$work" --numeric-owner -cf "$out/shardcoord-rootfs.tar" .
echo "build.sh: root filesystem $out/shardcoord-rootfs.tar ($(du -h "$out/shardcoord-rootfs.tar" | cut -f1))" >&2
if [[ -n $rootfs_dir ]]; then
  rm -rf "$rootfs_dir"
  mkdir -p "$(dirname "$rootfs_dir")"
  mv "$work" "$rootfs_dir"
  echo "build.sh: root filesystem unpacked in $rootfs_dir" >&2
else
  rm -rf "$work"
fi

if ((do_import)); then
  need podman podman
  podman import \
    --change 'USER 10001' \
    --change 'WORKDIR /var/lib/shardcoord' \
    --change 'ENV PATH=/usr/local/bin:/usr/bin:/bin' \
    --change 'CMD ["/usr/local/bin/shardctl", "--help"]' \
    "$out/shardcoord-rootfs.tar" "$tag" >/dev/null
  echo "build.sh: imported as $tag ($(podman image inspect --format '{{.Id}}' "$tag" | cut -c1-12))" >&2
fi
