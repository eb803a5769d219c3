#!/usr/bin/env bash
# Runs the real shardctl binary: `plan` offline (the JSON contract of `shardctl plan --json`,
# --explain on an N-d shard swap), and the online subcommands' flag errors (exit 2) and
# server errors (exit 1, "shardctl: CODE: message") against an address where nothing listens.
set -uo pipefail

shardctl="$1"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
failures=0
# Nothing listens on port 1 of loopback: connections are refused at once.
dead=127.0.0.1:1
# Fail at once instead of retrying the refused connections for the default 30 s.
export SHARDCOORD_WAIT=0s

fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}

# expect_exit CODE PATTERN ARGS...: exit CODE, nothing on stdout, one stderr line matching
# the fixed string PATTERN.
expect_exit() {
  local code="$1" pattern="$2"
  shift 2
  "$shardctl" "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  [[ $rc -eq $code ]] || fail "shardctl $* exited $rc, want $code: $(cat "$tmp/err")"
  [[ ! -s "$tmp/out" ]] || fail "shardctl $* wrote to stdout: $(cat "$tmp/out")"
  [[ $(wc -l <"$tmp/err") -eq 1 ]] || fail "shardctl $* wrote $(wc -l <"$tmp/err") lines to stderr: $(cat "$tmp/err")"
  grep -qF -- "$pattern" "$tmp/err" || fail "shardctl $*: stderr lacks '$pattern': $(cat "$tmp/err")"
}

# The issue's example.
json=$("$shardctl" plan --mesh 2x4 --ranks 0,1,2,3,4,5,6,7 --shape 64,48 --dtype f32 \
    --placements 'S(0),R' --to-mesh 4 --to-ranks 4,5,6,7 --to-placements 'S(1)' --json 2>"$tmp/err")
rc=$?
[[ $rc -eq 0 ]] || fail "plan --json exited $rc: $(cat "$tmp/err")"
[[ ! -s "$tmp/err" ]] || fail "plan --json wrote to stderr: $(cat "$tmp/err")"
[[ $(wc -l <<<"$json") -eq 1 ]] || fail "plan --json is not one line"
grep -qF '"bytes_moved": 6144, "lower_bound_bytes": 6144' <<<"$json" || fail "plan --json bytes: $json"
grep -qF '{"steps": [{"op": ' <<<"$json" || fail "plan --json has no steps first: $json"

# The contract, checked field by field where a JSON reader is at hand.
if [[ -x /usr/bin/python3 ]]; then
  /usr/bin/python3 - "$json" <<'PY' || fail "plan --json breaks the contract: $json"
import json, sys
p = json.loads(sys.argv[1])
assert p["steps"], "no steps"
for s in p["steps"]:
    assert isinstance(s["op"], str) and s["op"], s
    assert all(isinstance(r, int) for r in s["ranks"]) and s["ranks"], s
    assert isinstance(s["bytes"], int), s
assert p["transfers"], "no transfers"
total = 0
for t in p["transfers"]:
    assert t["src"] != t["dst"], t
    assert t["src"] in (0, 1, 2, 3) and t["dst"] in (4, 5, 6, 7), t
    assert len(t["offset"]) == 2 and len(t["shape"]) == 2, t
    assert t["bytes"] == t["shape"][0] * t["shape"][1] * 4, t
    total += t["bytes"]
assert total == p["bytes_moved"] == p["lower_bound_bytes"] == 6144, (total, p["bytes_moved"])
assert sum(s["bytes"] for s in p["steps"]) == total
PY
fi

# An N-d shard swap is all-to-all within sub-groups, never an all-gather.
explain=$("$shardctl" plan --mesh 2x4 --shape 64,48 --placements 'S(0),S(1)' \
    --to-placements 'S(1),S(0)' --explain 2>&1)
rc=$?
[[ $rc -eq 0 ]] || fail "plan --explain exited $rc: $explain"
grep -qF 'all_to_all' <<<"$explain" || fail "plan --explain shows no all_to_all:"$'\n'"$explain"
grep -qF 'all_gather' <<<"$explain" && fail "plan --explain shows an all_gather:"$'\n'"$explain"
grep -qF 'per-rank bytes' <<<"$explain" || fail "plan --explain shows no per-rank bytes:"$'\n'"$explain"
grep -qF 'estimated' <<<"$explain" || fail "plan --explain shows no estimate:"$'\n'"$explain"
summary=$("$shardctl" plan --mesh 2x4 --shape 64,48 --placements 'S(0),S(1)' --to-placements 'S(1),S(0)' 2>&1)
grep -qF 'S(0),S(1) on mesh 2x4 -> S(1),S(0) on mesh 2x4' <<<"$summary" || fail "plan summary:"$'\n'"$summary"

# Offline flag errors name the flag.
expect_exit 2 --to-placements plan --mesh 2x4 --shape 64,48 --placements 'S(0),R' --to-placements 'S(3)'
expect_exit 2 --to-ranks plan --mesh 2x4 --shape 64,48 --placements 'S(0),R' --to-mesh 4 --to-ranks 1,2
expect_exit 2 --hosts plan --mesh 2x4 --shape 64,48 --placements 'S(0),R' --hosts a,b
expect_exit 2 --cost plan --mesh 2 --shape 8 --placements 'S(0)' --cost nonsense=1
expect_exit 2 --mesh plan --shape 8 --placements 'S(0)'
expect_exit 2 --shape plan --mesh 2 --placements 'S(0)'
expect_exit 2 --coordinator plan --mesh 2 --shape 8 --placements 'S(0)' --coordinator "$dead"
# Online: offline-only flags and bad specs are flag errors before any call.
expect_exit 2 --shape plan t --placements 'S(1)' --shape 8 --coordinator "$dead"
expect_exit 2 --placements plan t --placements 'S(x)' --coordinator "$dead"
expect_exit 2 --placements plan t --coordinator "$dead"

# Online subcommands: bad flags exit 2 without calling anyone.
expect_exit 2 --shape tensor create t --mesh m --shape 4,a --placements R --coordinator "$dead"
expect_exit 2 --dtype tensor create t --mesh m --shape 4 --dtype f33 --placements R --coordinator "$dead"
expect_exit 2 --init tensor create t --mesh m --shape 4 --placements R --init ones --coordinator "$dead"
expect_exit 2 --flat tensor create t --mesh m --shape 4 --placements R --flat '0:4' --coordinator "$dead"
expect_exit 2 --placements tensor redistribute t --coordinator "$dead"
expect_exit 2 --to-rank tensor gather t --to-rank -1 --coordinator "$dead"
expect_exit 2 --shape mesh create m --shape 2x --coordinator "$dead"
expect_exit 2 --workers mesh create m --shape 2x2 --workers a,b,c --coordinator "$dead"
expect_exit 2 --dims mesh create m --shape 2x2 --dims dp --coordinator "$dead"
expect_exit 2 --mesh tensor create t --shape 4 --placements R
expect_exit 2 --out tensor download t
expect_exit 2 "give NAME and a spec, or --from-file, not both" tensor redistribute t \
    --placements R --from-file moves.json --coordinator "$dead"
expect_exit 2 "NAME is required (or --from-file)" tensor redistribute --placements R \
    --coordinator "$dead"
echo '{"moves": [{"tensor": "t", "spec": "R"}]}' >"$tmp/moves.json"
expect_exit 2 'moves[0]: unknown key "spec"' tensor redistribute --from-file "$tmp/moves.json" \
    --coordinator "$dead"

# Server errors: exit 1, "shardctl: CODE: message (coordinator ADDR)".
expect_exit 1 "shardctl: UNAVAILABLE: " workers --coordinator "$dead"
expect_exit 2 "--wait: 'soon' is not a duration >= 0" workers --coordinator "$dead" --wait soon
expect_exit 1 "(coordinator $dead)" mesh list --coordinator "$dead"
expect_exit 1 "shardctl: UNAVAILABLE: " tensor show t --coordinator "$dead"
expect_exit 1 "shardctl: UNAVAILABLE: " plan t --placements 'S(1)' --coordinator "$dead"
# Global flags go before or after the subcommand, at any depth: each form dials $dead.
expect_exit 1 "(coordinator $dead)" --coordinator "$dead" tensor list
expect_exit 1 "(coordinator $dead)" tensor --coordinator "$dead" list
expect_exit 1 "(coordinator $dead)" tensor list --coordinator "$dead"
expect_exit 1 "(coordinator $dead)" --json tensor --coordinator="$dead" list
expect_exit 1 "(coordinator $dead)" --coordinator "$dead" workers --json
expect_exit 1 "(coordinator $dead)" --coordinator "$dead" mesh get m
expect_exit 1 "(coordinator $dead)" --coordinator "$dead" tensor show t --json
expect_exit 1 "(coordinator $dead)" --coordinator "$dead" plan t --placements 'S(1)'
# The same value twice is one flag; different values are a flag error naming it.
expect_exit 1 "(coordinator $dead)" --coordinator "$dead" tensor list --coordinator "$dead"
expect_exit 2 --coordinator --coordinator "$dead" tensor list --coordinator 127.0.0.1:2
expect_exit 2 --coordinator --coordinator "$dead" plan --mesh 2 --shape 8 --placements 'S(0)'
SHARDCOORD_ADDR="$dead" "$shardctl" tensor list >"$tmp/out" 2>"$tmp/err"
[[ $? -eq 1 ]] && grep -qF "(coordinator $dead)" "$tmp/err" || fail "SHARDCOORD_ADDR is not used: $(cat "$tmp/err")"

# Local file errors on upload are reported before any call.
expect_exit 1 "shardctl: NOT_FOUND: cannot open '$tmp/none.npy'" \
  tensor upload t --mesh m --placements R --from "$tmp/none.npy" --coordinator "$dead"
printf 'not numpy' >"$tmp/bad.npy"
expect_exit 1 "shardctl: INVALID_ARGUMENT: $tmp/bad.npy: malformed .npy: bad magic" \
  tensor upload t --mesh m --placements R --from "$tmp/bad.npy" --coordinator "$dead"

# Help of every subcommand.
for cmd in workers "mesh create" "mesh list" "mesh get" "mesh delete" "tensor create" \
    "tensor redistribute" "tensor gather" "tensor download" "tensor upload" "tensor show" \
    "tensor list" "tensor delete" plan; do
  # shellcheck disable=SC2086
  "$shardctl" $cmd --help >"$tmp/out" 2>&1 || fail "shardctl $cmd --help failed"
  grep -qF -- --coordinator "$tmp/out" || fail "shardctl $cmd --help does not describe --coordinator"
done

if ((failures > 0)); then
  echo "$failures check(s) failed" >&2
  exit 1
fi
echo "all shardctl plan and client checks passed"
