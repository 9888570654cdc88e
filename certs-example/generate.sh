#!/usr/bin/env bash
# Development certificates for gpu-guard with openssl: a CA and a serving certificate for the
# webhook Service (gpu-guard.gpu-guard.svc), localhost and 127.0.0.1.
#   certs-example/generate.sh [OUT_DIR] [NAMESPACE] [SERVICE]
# The same as `gpu-guard certs --out-dir OUT_DIR`. For development only; see README.md here.
set -euo pipefail
out="${1:-certs-example/out}"
namespace="${2:-gpu-guard}"
service="${3:-gpu-guard}"
dns="${service}.${namespace}.svc"
mkdir -p "$out"
umask 077
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
  -keyout "$tmp/ca.key" -out "$out/ca.crt" -days 365 \
  -subj "/CN=gpu-guard development CA" \
  -addext "basicConstraints=critical,CA:TRUE" \
  -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null

openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
  -keyout "$out/tls.key" -out "$tmp/tls.csr" -subj "/CN=${dns}" 2>/dev/null

cat > "$tmp/ext.cnf" <<EXT
basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=DNS:${dns},DNS:${dns}.cluster.local,DNS:localhost,IP:127.0.0.1
EXT
openssl x509 -req -in "$tmp/tls.csr" -CA "$out/ca.crt" -CAkey "$tmp/ca.key" \
  -CAcreateserial -out "$out/tls.crt" -days 90 -extfile "$tmp/ext.cnf" 2>/dev/null
chmod 644 "$out/ca.crt" "$out/tls.crt"
chmod 600 "$out/tls.key"
echo "wrote $out/ca.crt $out/tls.crt $out/tls.key (serving: ${dns}, localhost, 127.0.0.1; 90 days)"
