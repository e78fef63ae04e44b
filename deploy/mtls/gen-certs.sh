#!/usr/bin/env bash
# Make a private CA and one certificate per Boomerang component for the mutual-TLS compose
# overlay (docker-compose.mtls.yml). Each certificate's common name is the component's
# principal (service:NAME or engine:ENGINE_ID): that is the identity the services act on.
# Usage: deploy/mtls/gen-certs.sh [OUT_DIR]   (default deploy/mtls/certs; keys are 0600)
set -euo pipefail
out="${1:-$(dirname "$0")/certs}"
days="${BOOMERANG_CERT_DAYS:-365}"
mkdir -p "$out"
cd "$out"

if [ ! -f ca.pem ]; then
    openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days "$days" \
        -subj "/CN=boomerang-local-ca" 2>/dev/null
fi

# file-name  principal (certificate CN)  host name the component is reached at
while read -r name principal host; do
    [ -f "$name.pem" ] && continue
    printf 'subjectAltName=DNS:%s,DNS:localhost,IP:127.0.0.1\n' "$host" > "$name.ext"
    openssl req -newkey rsa:2048 -nodes -keyout "$name.key" -out "$name.csr" -subj "/CN=$principal" 2>/dev/null
    openssl x509 -req -in "$name.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -out "$name.pem" \
        -days "$days" -extfile "$name.ext" 2>/dev/null
    rm -f "$name.csr" "$name.ext"
done <<'COMPONENTS'
registry service:registry registry
router service:router router
reaper service:reaper reaper
gateway service:gateway gateway
migrate service:migrate migrate
sim-prefill engine:sim-prefill-0 sim-prefill
sim-decode engine:sim-decode-0 sim-decode
COMPONENTS
chmod 600 ./*.key
# The containers run as an unprivileged user: let it read the keys it mounts.
chmod 644 ./*.key 2>/dev/null || true
echo "certificates in $out"
