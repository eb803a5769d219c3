#!/usr/bin/env bash
# Runs the real shardctl binary: exact JSON for the seed examples, and one stderr line that
# names the flag (with exit status 2) for each kind of bad input.
set -uo pipefail

shardctl="$1"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
failures=0

fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}

# expect_json EXPECTED ARGS...: exit 0, stdout exactly EXPECTED, stderr empty.
expect_json() {
  local expected="$1"
  shift
  local out
  out=$("$shardctl" "$@" 2>"$tmp/err")
  local rc=$?
  [[ $rc -eq 0 ]] || fail "shardctl $* exited $rc: $(cat "$tmp/err")"
  [[ "$out" == "$expected" ]] || fail "shardctl $*"$'\n'"  got:  $out"$'\n'"  want: $expected"
  [[ ! -s "$tmp/err" ]] || fail "shardctl $* wrote to stderr: $(cat "$tmp/err")"
}

# expect_error FLAG ARGS...: exit 2, nothing on stdout, exactly one stderr line naming FLAG.
expect_error() {
  local flag="$1"
  shift
  "$shardctl" "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  local lines
  lines=$(wc -l <"$tmp/err")
  [[ $rc -eq 2 ]] || fail "shardctl $* exited $rc, want 2"
  [[ ! -s "$tmp/out" ]] || fail "shardctl $* wrote to stdout: $(cat "$tmp/out")"
  [[ $lines -eq 1 ]] || fail "shardctl $* wrote $lines lines to stderr: $(cat "$tmp/err")"
  grep -qF -- "$flag" "$tmp/err" || fail "shardctl $*: stderr does not name $flag: $(cat "$tmp/err")"
}

# The seed examples.
expect_json '{"chunks": [{"rank": 0, "coord": [0, 0], "offset": [0, 0], "shape": [1, 4]}, {"rank": 1, "coord": [0, 1], "offset": [1, 0], "shape": [1, 4]}, {"rank": 2, "coord": [0, 2], "offset": [2, 0], "shape": [1, 4]}, {"rank": 3, "coord": [0, 3], "offset": [3, 0], "shape": [1, 4]}, {"rank": 4, "coord": [1, 0], "offset": [4, 0], "shape": [1, 4]}, {"rank": 5, "coord": [1, 1], "offset": [5, 0], "shape": [1, 4]}, {"rank": 6, "coord": [1, 2], "offset": [6, 0], "shape": [1, 4]}, {"rank": 7, "coord": [1, 3], "offset": [7, 0], "shape": [1, 4]}]}' \
  layout --mesh 2x4 --ranks 0,1,2,3,4,5,6,7 --dims dp,tp --shape 8,4 --placements 'S(0),S(0)' --dtype f32 --json
expect_json '{"chunks": [{"rank": 0, "coord": [0, 0], "offset": [0, 0], "shape": [1, 4]}, {"rank": 1, "coord": [0, 1], "offset": [1, 0], "shape": [1, 4]}, {"rank": 2, "coord": [0, 2], "offset": [2, 0], "shape": [1, 4]}, {"rank": 3, "coord": [0, 3], "offset": [3, 0], "shape": [1, 4]}, {"rank": 4, "coord": [1, 0], "offset": [4, 0], "shape": [1, 4]}, {"rank": 5, "coord": [1, 1], "offset": [5, 0], "shape": [1, 4]}, {"rank": 6, "coord": [1, 2], "offset": [6, 0], "shape": [1, 4]}, {"rank": 7, "coord": [1, 3], "offset": [7, 0], "shape": [1, 4]}]}' \
  layout --mesh 2x4 --shape 8,4 --placements 'S(0),S(0)' --json
expect_json '{"chunks": [{"rank": 0, "coord": [0], "offset": [0, 0], "shape": [1, 4], "local_offset": 0}, {"rank": 0, "coord": [0], "offset": [4, 0], "shape": [2, 5], "local_offset": 4}, {"rank": 1, "coord": [1], "offset": [0, 4], "shape": [1, 1], "local_offset": 0}, {"rank": 1, "coord": [1], "offset": [1, 0], "shape": [3, 5], "local_offset": 1}, {"rank": 2, "coord": [2], "offset": [0, 0], "shape": [0, 0], "local_offset": 0}, {"rank": 3, "coord": [3], "offset": [0, 0], "shape": [0, 0], "local_offset": 0}]}' \
  layout --mesh 4 --shape 6,5 --flat '0:4,20:30;4:20;;' --json
expect_json '{"chunks": [{"rank": 0, "coord": [0], "offset": [0], "shape": [1]}, {"rank": 1, "coord": [1], "offset": [1], "shape": [1]}, {"rank": 2, "coord": [2], "offset": [2], "shape": [0]}, {"rank": 3, "coord": [3], "offset": [2], "shape": [0]}, {"rank": 4, "coord": [4], "offset": [2], "shape": [0]}, {"rank": 5, "coord": [5], "offset": [2], "shape": [0]}, {"rank": 6, "coord": [6], "offset": [2], "shape": [0]}, {"rank": 7, "coord": [7], "offset": [2], "shape": [0]}]}' \
  layout --mesh 8 --shape 2 --placements 'S(0)' --json
expect_json '{"chunks": [{"rank": 0, "coord": [0], "offset": [0, 0], "shape": [3, 2]}, {"rank": 1, "coord": [1], "offset": [3, 0], "shape": [5, 2]}]}' \
  layout --mesh 2 --shape 8,2 --placements 'S(0,[3,5])' --json

# --json is global: before the subcommand it means the same as after it.
expect_json '{"chunks": [{"rank": 0, "coord": [0], "offset": [0, 0], "shape": [3, 2]}, {"rank": 1, "coord": [1], "offset": [3, 0], "shape": [5, 2]}]}' \
  --json layout --mesh 2 --shape 8,2 --placements 'S(0,[3,5])'
expect_json '{"chunks": [{"rank": 0, "coord": [0], "offset": [0, 0], "shape": [3, 2]}, {"rank": 1, "coord": [1], "offset": [3, 0], "shape": [5, 2]}]}' \
  --json layout --mesh 2 --shape 8,2 --placements 'S(0,[3,5])' --json

# --version: "shardctl X.Y.Z" on stdout, status 0, wherever it is given.
for args in "--version" "layout --version" "tensor list --version"; do
  # shellcheck disable=SC2086
  version=$("$shardctl" $args 2>"$tmp/err")
  rc=$?
  [[ $rc -eq 0 ]] || fail "shardctl $args exited $rc"
  [[ "$version" =~ ^shardctl\ [0-9]+\.[0-9]+\.[0-9]+$ ]] || fail "shardctl $args printed '$version'"
  [[ ! -s "$tmp/err" ]] || fail "shardctl $args wrote to stderr: $(cat "$tmp/err")"
done

# Human output: the table rows and the picture.
human=$("$shardctl" layout --mesh 2x4 --dims dp,tp --shape 8,4 --placements 'S(0),S(0)' 2>&1)
rc=$?
[[ $rc -eq 0 ]] || fail "human output exited $rc: $human"
grep -qxF '   5  [1, 1]  [5, 0]  [1, 4]     16' <<<"$human" || fail "table row of rank 5 missing:"$'\n'"$human"
grep -qxF '  7 7 7 7' <<<"$human" || fail "picture row of rank 7 missing:"$'\n'"$human"

# Help works and describes every flag.
help=$("$shardctl" layout --help)
rc=$?
[[ $rc -eq 0 ]] || fail "layout --help exited $rc"
for flag in --mesh --ranks --dims --shape --placements --flat --dtype --json; do
  grep -qF -- "$flag" <<<"$help" || fail "layout --help does not describe $flag"
done

# The global flags are described once, in the top-level help, and named in every
# subcommand's help.
help=$("$shardctl" --help)
rc=$?
[[ $rc -eq 0 ]] || fail "--help exited $rc"
for flag in --coordinator --json --version; do
  [[ $(grep -cE -- "^ +$flag( |\$)" <<<"$help") -eq 1 ]] || fail "--help does not describe $flag once"
done
for cmd in "workers" "tensor" "tensor list" "mesh create" "plan"; do
  # shellcheck disable=SC2086
  help=$("$shardctl" $cmd --help)
  for flag in --coordinator --json --version; do
    grep -qF -- "$flag" <<<"$help" || fail "$cmd --help does not name the global flag $flag"
  done
done

# Bad input.
expect_error --placements layout --mesh 2x4 --shape 8,4 --placements 'S(3),S(0)'
expect_error --placements layout --mesh 2 --shape 8,4 --placements 'S(0,[3,4])'
expect_error --placements layout --mesh 2x2 --shape 8 --placements 'S(0)'
expect_error --placements layout --mesh 2 --shape 8 --placements 'Q(0)'
expect_error --ranks layout --mesh 2x4 --ranks 0,1,2,3,4,5,6 --shape 8,4 --placements 'S(0),S(0)'
expect_error --ranks layout --mesh 2 --ranks 3,3 --shape 8 --placements 'S(0)'
expect_error --dims layout --mesh 2x4 --dims dp --shape 8,4 --placements 'S(0),S(0)'
expect_error --mesh layout --mesh 2x0 --shape 8 --placements 'S(0)'
expect_error --flat layout --mesh 2 --shape 6,5 --flat '0:10;5:30'
expect_error --flat layout --mesh 2 --shape 6,5 --flat '0:10;15:30'
expect_error --flat layout --mesh 2 --shape 6,5 --flat '0:10;10:30;'
expect_error --flat layout --mesh 2 --shape 6,5 --placements 'S(0)' --flat '0:15;15:30'
expect_error --shape layout --mesh 2 --shape 4294967296,4294967296 --placements 'S(0)'
expect_error --shape layout --mesh 2 --shape 8,-1 --placements 'S(0)'
expect_error --dtype layout --mesh 2 --shape 8 --placements 'S(0)' --dtype f33
expect_error --placements layout --mesh 2 --shape 8
expect_error --mesh layout --shape 8 --placements 'S(0)'
expect_error --shape layout --mesh 2 --placements 'S(0)'
expect_error --bogus layout --mesh 2 --shape 8 --placements 'S(0)' --bogus
expect_error subcommand
# A global flag repeated with different values is a flag error, wherever the copies are.
expect_error --json --json layout --mesh 2 --shape 8 --placements 'S(0)' --json=false
expect_error --coordinator --coordinator 127.0.0.1:1 layout --mesh 2 --shape 8 \
  --placements 'S(0)' --coordinator 127.0.0.1:2

if ((failures > 0)); then
  echo "$failures check(s) failed" >&2
  exit 1
fi
echo "all shardctl checks passed"
