#!/usr/bin/env bash
# Formats the tree's C++ and CUDA sources with clang-format-14 and the repository's
# .clang-format.
#   tools/format.sh            rewrite every file that differs
#   tools/format.sh --check    change nothing; list the files that differ and exit 1 if any do
#   tools/format.sh FILE...    format only these files
set -euo pipefail
cd "$(dirname "$0")/.."

CLANG_FORMAT=${CLANG_FORMAT:-clang-format-14}
if ! command -v "$CLANG_FORMAT" >/dev/null; then
  echo "format: $CLANG_FORMAT not found (tools/setup.sh installs it)" >&2
  exit 2
fi

check=0
if [[ ${1:-} == --check ]]; then
  check=1
  shift
fi
if (($#)); then
  files=("$@")
else
  mapfile -t files < <(git ls-files -- '*.h' '*.cc' '*.cu')
fi

if ((!check)); then
  ((${#files[@]})) && "$CLANG_FORMAT" -i --style=file "${files[@]}"
  exit 0
fi

differ=()
for f in "${files[@]}"; do
  if ! "$CLANG_FORMAT" --style=file --dry-run -Werror "$f" >/dev/null 2>&1; then differ+=("$f"); fi
done
if ((${#differ[@]})); then
  echo "format: ${#differ[@]} file(s) differ from clang-format-14 (run tools/format.sh):" >&2
  printf '  %s\n' "${differ[@]}" >&2
  exit 1
fi
echo "format: ${#files[@]} files clean"
