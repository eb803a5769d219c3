#!/usr/bin/env bash
# The `shardcoord` package as users install it (issue 29): copies what the build reads from a
# checkout (client/python, client/version.h, proto/shardcoord*.proto) into $TEST_TMPDIR, runs
#   /usr/bin/python3 -m venv --system-site-packages V && V/bin/pip install --no-build-isolation
# offline (PIP_NO_INDEX), checks from / that the install is what is imported and that
# shardcoord.__version__ is what `shardctl --version` prints, builds an sdist and a wheel from
# that sdist (stubs and version inside), then runs the package's tests from the install.
#
#   install_test.sh PACKAGE_INIT VERSION_H PROTO SHARDCTL COORDINATOR WORKER CLUSTER_PY DEV_CERTS
# (runfiles paths: PACKAGE_INIT is client/python/shardcoord/__init__.py).
set -euo pipefail
python=/usr/bin/python3
for module in grpc numpy venv setuptools wheel; do
  if ! "$python" -c "import $module" 2>/dev/null; then
    echo "SKIP: $python lacks $module (bash tools/setup.sh installs python3-grpcio python3-numpy python3-venv python3-setuptools python3-wheel)"
    exit 0
  fi
done
abs() { (cd "$(dirname "$1")" && echo "$PWD/$(basename "$1")"); }
pkg_dir=$(cd "$(dirname "$1")/.." && pwd)   # client/python
version_h=$(abs "$2") proto=$(abs "$3") shardctl=$(abs "$4")
coordinator=$(abs "$5") worker=$(abs "$6") cluster=$(abs "$7") dev_certs=$(abs "$8")
tmp=${TEST_TMPDIR:?}
export PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PYTHONDONTWRITEBYTECODE=1
unset PYTHONPATH SHARDCOORD_PY_STUBS

# A checkout's shape, without what tools/python.sh or earlier builds left in client/python.
src=$tmp/src
rm -rf "$src" && mkdir -p "$src/client/python" "$src/proto"
cp -RL "$pkg_dir"/. "$src/client/python"
rm -rf "$src/client/python/shardcoord/_gen" "$src/client/python/build" \
  "$src/client/python"/*.egg-info
find "$src" -name __pycache__ -prune -exec rm -rf {} +
cp -L "$version_h" "$src/client/version.h"
cp -L "$(dirname "$proto")"/shardcoord*.proto "$src/proto/"  # The API and the files it imports.

venv=$tmp/venv
rm -rf "$venv"
"$python" -m venv --system-site-packages "$venv"
(cd "$src" && "$venv/bin/pip" install -q --no-build-isolation ./client/python)

cd /
got=$("$venv/bin/python" -c 'import shardcoord; print(shardcoord.__version__)')
want=$("$shardctl" --version)
want=${want#shardctl }
if [[ "$got" != "$want" ]]; then
  echo "FAIL: shardcoord.__version__ is '$got', shardctl --version says '$want'" >&2
  exit 1
fi
echo "ok: shardcoord.__version__ $got == shardctl --version"
where=$("$venv/bin/python" -c 'import shardcoord, shardcoord_client; print(shardcoord.__file__, shardcoord.pb.__file__, shardcoord_client.__file__)')
for file in $where; do
  if [[ "$file" != "$venv"/lib/python3*/site-packages/* ]]; then
    echo "FAIL: $file is imported from outside the install in $venv" >&2
    exit 1
  fi
done
echo "ok: imported from the install: $where"

# An sdist carries the proto and version.h; a wheel built from it has the stubs and version.
dist=$tmp/dist
rm -rf "$dist" "$tmp/sdist" && mkdir -p "$dist" "$tmp/sdist"
(cd "$src/client/python" && "$venv/bin/python" -c \
  "from setuptools import build_meta as b; print(b.build_sdist('$dist'))" >/dev/null)
tar -xzf "$dist"/shardcoord-*.tar.gz -C "$tmp/sdist"
(cd "$tmp/sdist"/shardcoord-* && "$venv/bin/python" -c \
  "from setuptools import build_meta as b; print(b.build_wheel('$dist'))" >/dev/null)
"$venv/bin/python" - "$dist" "$want" <<'PY'
import glob, sys, zipfile
wheel, = glob.glob(sys.argv[1] + "/shardcoord-*.whl")
names = zipfile.ZipFile(wheel).namelist()
for need in ("shardcoord/_gen/shardcoord_pb2.py", "shardcoord/_gen/shardcoord_pb2_grpc.py",
             "shardcoord/layouts.py", "shardcoord/check.py", "shardcoord_client.py"):
    assert need in names, (need, names)
version = zipfile.ZipFile(wheel).read("shardcoord/_version.py").decode()
assert f'__version__ = "{sys.argv[2]}"' in version, version
print(f"ok: wheel from the sdist: {wheel.rsplit('/', 1)[1]} has the stubs and version {sys.argv[2]}")
PY

# The package's tests, from copies outside the checkout so that only the install is importable.
tests=$tmp/tests
rm -rf "$tests" && mkdir -p "$tests"
cp "$src/client/python/shardcoord_test.py" "$src/client/python/layouts_test.py" \
  "$src/client/python/check_test.py" "$tests/"
"$venv/bin/python" "$tests/shardcoord_test.py" "$dev_certs"
"$venv/bin/python" "$tests/layouts_test.py" "--shardctl=$shardctl"
"$venv/bin/python" "$tests/check_test.py" "--coordinator=$coordinator" "--worker=$worker" \
  "--cluster=$cluster"
echo "install_test: OK"
