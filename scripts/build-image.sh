#!/usr/bin/env bash
# Builds the gpu-guard container image without a registry: the release binary is built here (or
# given with --binary), staged with the shared libraries it links into target/image-root/, and
# the Containerfile copies that into an empty image. See docs/install.md#the-image.
#
#   scripts/build-image.sh [--binary PATH] [--engine podman|buildah|docker] [TAG]
#
# TAG defaults to gpu-guard:v<version>. The engine defaults to the first of podman, buildah and
# docker found (or $CONTAINER_ENGINE). Prints the tag on stdout when done.
set -euo pipefail

usage() {
  sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit "${1:-2}"
}

binary=""
engine="${CONTAINER_ENGINE:-}"
tag=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --binary) binary="${2:?--binary needs a path}"; shift 2 ;;
    --engine) engine="${2:?--engine needs podman, buildah or docker}"; shift 2 ;;
    -h | --help) usage 0 ;;
    -*) echo "unknown option $1" >&2; usage ;;
    *) [[ -z "$tag" ]] || usage; tag="$1"; shift ;;
  esac
done
if [[ -n "$binary" ]]; then
  binary="$(realpath "$binary")" # the build runs from the repository's root
fi
cd "$(dirname "$0")/.."

if [[ -z "$engine" ]]; then
  for candidate in podman buildah docker; do
    if command -v "$candidate" >/dev/null 2>&1; then engine="$candidate"; break; fi
  done
fi
case "$engine" in
  podman | docker) build=("$engine" build) ;;
  buildah) build=(buildah build) ;;
  "") echo "no container engine: install podman, buildah or docker (Debian: apt-get install podman)" >&2; exit 1 ;;
  *) echo "unsupported engine $engine: use podman, buildah or docker" >&2; exit 2 ;;
esac
command -v "$engine" >/dev/null 2>&1 || { echo "$engine not found" >&2; exit 1; }

if [[ -z "$binary" ]]; then
  echo "== cargo build --release --locked" >&2
  cargo build --release --locked >&2
  binary="${CARGO_TARGET_DIR:-target}/release/gpu-guard"
fi
[[ -x "$binary" ]] || { echo "$binary: not an executable" >&2; exit 1; }

# The root filesystem: the binary, its ELF interpreter and every library ldd resolves, at the
# paths the loader looks for them; the copyright files of the packages they come from (glibc and
# libgcc are LGPL and GPL with the runtime exception); an empty /tmp (`serve` without a
# certificate writes its CA bundle there). Nothing else: no shell, no package manager.
root=target/image-root
rm -rf "$root"
mkdir -p "$root/tmp"
chmod 1777 "$root/tmp"
install -m 0755 "$binary" "$root/gpu-guard"
libraries="$(ldd "$binary")" || { echo "ldd $binary failed: is it a dynamically linked x86_64 binary?" >&2; exit 1; }
paths="$(awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' <<<"$libraries" | sort -u)"
if grep -q 'not found' <<<"$libraries"; then
  echo "ldd $binary: a library is missing on this host:" >&2
  echo "$libraries" >&2
  exit 1
fi
for path in $paths; do
  mkdir -p "$root$(dirname "$path")"
  cp -L "$path" "$root$path"
  if command -v dpkg >/dev/null 2>&1; then
    package="$( (dpkg -S "$path" || dpkg -S "$(readlink -f "$path")") 2>/dev/null | head -n1 | cut -d: -f1)" || true
    if [[ -n "$package" && -f "/usr/share/doc/$package/copyright" ]]; then
      mkdir -p "$root/usr/share/doc/$package"
      cp "/usr/share/doc/$package/copyright" "$root/usr/share/doc/$package/copyright"
    fi
  fi
done
echo "== staged $root:" >&2
(cd "$root" && find . -mindepth 1 ! -type d -printf '  /%P %s bytes\n' | sort) >&2

version="$("$root/gpu-guard" --version | awk '{ print $2 }')"
revision="$(git rev-parse HEAD 2>/dev/null || echo unknown)"
if [[ "$revision" != unknown && -n "$(git status --porcelain 2>/dev/null)" ]]; then
  revision="$revision-dirty"
fi
tag="${tag:-gpu-guard:v$version}"

echo "== $engine build -t $tag" >&2
"${build[@]}" -f Containerfile \
  --build-arg "VERSION=$version" \
  --build-arg "REVISION=$revision" \
  -t "$tag" . >&2
echo "$tag"
