#!/usr/bin/env bash
# statecachectl against a statecached that requires bearer tokens: with
# --token_file (or STATECACHE_TOKEN_FILE; the flag wins) the status command
# succeeds; without it, or with a wrong token, it fails with UNAUTHENTICATED;
# an unreadable token file is a usage error.
set -euo pipefail
unset STATECACHE_SERVER STATECACHE_TOKEN_FILE
ctl="$1"
server="$2"
tmp="$(mktemp -d)"
trap 'kill "$pid" 2>/dev/null || true; rm -rf "$tmp"' EXIT
token="ctl-test-token-$RANDOM$RANDOM"
digest="$(printf %s "$token" | sha256sum | cut -d' ' -f1)"
printf 'tenant ops\ntoken ops sha256:%s\n' "$digest" > "$tmp/tenants"
printf '%s\n' "$token" > "$tmp/token"
printf 'wrong-token\n' > "$tmp/wrong"
sock="unix:$tmp/sc.sock"
"$server" --backend=cpu --listen="$sock" --metrics_port=0 --tenants_file="$tmp/tenants" \
  --state_memory_bytes=16777216 --checkpoint_memory_bytes=16777216 > "$tmp/server.log" 2>&1 &
pid=$!
for _ in $(seq 100); do [ -S "$tmp/sc.sock" ] && break; sleep 0.1; done

"$ctl" --server="$sock" --token_file="$tmp/token" status > "$tmp/ok.log" 2>&1 \
  || { echo "status with the token failed:"; cat "$tmp/ok.log" "$tmp/server.log"; exit 1; }
STATECACHE_TOKEN_FILE="$tmp/token" "$ctl" --server="$sock" status > "$tmp/env.log" 2>&1 \
  || { echo "status with STATECACHE_TOKEN_FILE failed:"; cat "$tmp/env.log"; exit 1; }
STATECACHE_SERVER="$sock" "$ctl" --token_file="$tmp/token" status > "$tmp/env2.log" 2>&1 \
  || { echo "status with STATECACHE_SERVER failed:"; cat "$tmp/env2.log"; exit 1; }
if STATECACHE_TOKEN_FILE="$tmp/token" "$ctl" --server="$sock" --token_file="$tmp/wrong" status \
    > "$tmp/override.log" 2>&1; then
  echo "--token_file did not override STATECACHE_TOKEN_FILE"; exit 1
fi
if "$ctl" --server="$sock" status > "$tmp/none.log" 2>&1; then
  echo "status without a token succeeded"; exit 1
fi
grep -q UNAUTHENTICATED "$tmp/none.log" || { echo "no UNAUTHENTICATED:"; cat "$tmp/none.log"; exit 1; }
if "$ctl" --server="$sock" --token_file="$tmp/wrong" status > "$tmp/wrong.log" 2>&1; then
  echo "status with a wrong token succeeded"; exit 1
fi
grep -q UNAUTHENTICATED "$tmp/wrong.log" || { echo "no UNAUTHENTICATED:"; cat "$tmp/wrong.log"; exit 1; }
set +e
"$ctl" --server="$sock" --token_file="$tmp/missing" status > "$tmp/missing.log" 2>&1
rc=$?
set -e
[ "$rc" -eq 2 ] && grep -q "token_file" "$tmp/missing.log" \
  || { echo "missing token file: rc=$rc"; cat "$tmp/missing.log"; exit 1; }
echo "1 passed, 0 failed"
