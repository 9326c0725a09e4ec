#!/bin/sh
# Makes a private CA and one NATS server certificate signed by it, unless DIR already
# holds them. Writes DIR/ca.crt, DIR/tls.crt and DIR/tls.key (the key names of a
# Kubernetes TLS Secret). The certificate serves both client connections and the
# cluster routes (which verify each other: extended key usage serverAuth and clientAuth),
# so it names every host a client or a peer dials.
#
#   infra/nats-certs.sh DIR NAME [NAME...]     NAMEs: DNS names or IP addresses
#
# The CA's key is thrown away (nothing more is signed with it) unless KEEP_CA_KEY=1,
# which leaves it in DIR/ca.key, e.g. to sign client certificates for mutual TLS.
# Needs only openssl; the compose file runs it in the Steno image.
set -eu

if [ $# -lt 2 ]; then
    echo "usage: $0 DIR NAME [NAME...]" >&2
    exit 2
fi
dir=$1
shift
if [ -s "$dir/ca.crt" ] && [ -s "$dir/tls.crt" ] && [ -s "$dir/tls.key" ]; then
    echo "nats-certs: $dir already holds ca.crt, tls.crt and tls.key; keeping them"
    exit 0
fi

san=""
for name in "$@"; do
    case $name in
        *:*) entry="IP:$name" ;;
        *[!0-9.]*) entry="DNS:$name" ;;
        *) entry="IP:$name" ;;
    esac
    san="${san:+$san,}$entry"
done

mkdir -p "$dir"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
umask 077

openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 3650 \
    -subj "/CN=Steno NATS CA" -keyout "$work/ca.key" -out "$work/ca.crt" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -subj "/CN=$1" -keyout "$work/tls.key" -out "$work/tls.csr" 2>/dev/null
cat > "$work/ext" <<EOF
basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth,clientAuth
subjectAltName=$san
EOF
openssl x509 -req -in "$work/tls.csr" -CA "$work/ca.crt" -CAkey "$work/ca.key" \
    -CAcreateserial -CAserial "$work/ca.srl" -days 825 -extfile "$work/ext" -out "$work/tls.crt" 2>/dev/null

# Certificates are public; the key stays readable by its owner only.
chmod 644 "$work/ca.crt" "$work/tls.crt"
chmod 600 "$work/tls.key"
mv "$work/ca.crt" "$work/tls.crt" "$work/tls.key" "$dir/"
if [ "${KEEP_CA_KEY:-0}" = 1 ]; then
    mv "$work/ca.key" "$dir/ca.key"
fi
echo "nats-certs: wrote $dir/ca.crt, $dir/tls.crt and $dir/tls.key for $san"
