#!/usr/bin/env bash
# Generates a throwaway CA, a server certificate for 127.0.0.1/localhost and
# two client certificates (one signed by the CA, one self-signed) into $1.
# Test-time only: no private key is ever committed.
#   bash tests/e2e/testdata/make_test_certs.sh "$TEST_TMPDIR/certs"
set -euo pipefail
out=$1
mkdir -p "$out" && cd "$out"
key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:prime256v1 -out "$1" 2>/dev/null; }
key ca.key
openssl req -x509 -new -key ca.key -out ca.pem -days 2 -subj /CN=statecache-test-ca 2>/dev/null
sign() {  # name cn san
  key "$1.key"
  openssl req -new -key "$1.key" -out "$1.csr" -subj "/CN=$2" 2>/dev/null
  printf 'subjectAltName=%s\nbasicConstraints=CA:FALSE\n' "$3" > "$1.ext"
  openssl x509 -req -in "$1.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -out "$1.pem" \
    -days 2 -extfile "$1.ext" 2>/dev/null
}
sign server localhost "IP:127.0.0.1,DNS:localhost"
sign client worker "DNS:worker"
key rogue.key
openssl req -x509 -new -key rogue.key -out rogue.pem -days 2 -subj /CN=rogue 2>/dev/null
