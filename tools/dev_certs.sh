#!/usr/bin/env bash
# Makes development TLS material with the openssl CLI (EC P-256 keys, PEM):
#   tools/dev_certs.sh DIR [WORKER_NAME...]     (default names: w0 w1 w2 w3)
# In DIR:
#   ca.pem, ca.key                 the CA every daemon and client trusts (--tls-ca)
#   coordinator.pem/.key           the coordinator (CN coordinator; SAN localhost, 127.0.0.1, ::1,
#                                  and the names in $COORDINATOR_SANS, e.g. "DNS:shardcoord" for
#                                  a Kubernetes Service, see deploy/README.md)
#   NAME.pem/.key per worker       CN and SAN DNS:NAME (the name it registers with)
#   client.pem/.key                a client certificate (CN client) for shardctl --tls-cert
#   other-ca.pem, other-ca.key     a second, unrelated CA, for negative tests
#   other.pem/.key                 signed by other-ca, CN/SAN = the first worker name
# Every leaf certificate may serve and call (extendedKeyUsage serverAuth, clientAuth): a
# worker presents the same one to the coordinator and to the coordinator's calls.
# For development and tests only: the keys are written unencrypted.
set -euo pipefail

if [[ $# -lt 1 || "$1" == -* ]]; then
  echo "usage: $0 DIR [WORKER_NAME...]" >&2
  exit 2
fi
dir="$1"
shift
names=("$@")
if [[ ${#names[@]} -eq 0 ]]; then names=(w0 w1 w2 w3); fi
command -v openssl > /dev/null || {
  echo "$0: openssl not found (apt-get install openssl)" >&2
  exit 1
}
mkdir -p "$dir"
umask 077

new_key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2> /dev/null; }

# new_ca NAME CN
new_ca() {
  new_key "$dir/$1.key"
  openssl req -x509 -new -key "$dir/$1.key" -subj "/CN=$2" -days 3650 -sha256 \
    -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign" -out "$dir/$1.pem" 2> /dev/null
}

# new_leaf CA FILE CN SAN
new_leaf() {
  local ext
  ext="$(mktemp)"
  printf '%s\n' "basicConstraints=critical,CA:FALSE" \
    "keyUsage=critical,digitalSignature,keyEncipherment" \
    "extendedKeyUsage=serverAuth,clientAuth" "subjectAltName=$4" > "$ext"
  new_key "$dir/$2.key"
  openssl req -new -key "$dir/$2.key" -subj "/CN=$3" 2> /dev/null |
    openssl x509 -req -CA "$dir/$1.pem" -CAkey "$dir/$1.key" -set_serial "0x$(openssl rand -hex 16)" \
      -days 825 -sha256 -extfile "$ext" -out "$dir/$2.pem" 2> /dev/null
  rm -f "$ext"
}

new_ca ca "shardcoord dev CA"
new_leaf ca coordinator coordinator "DNS:localhost,IP:127.0.0.1,IP:::1${COORDINATOR_SANS:+,$COORDINATOR_SANS}"
for n in "${names[@]}"; do new_leaf ca "$n" "$n" "DNS:$n"; done
new_leaf ca client client "DNS:client"
new_ca other-ca "unrelated CA"
new_leaf other-ca other "${names[0]}" "DNS:${names[0]}"
chmod 0644 "$dir"/*.pem
echo "dev certificates in $dir: ca, coordinator, ${names[*]}, client, other-ca, other"
