#!/usr/bin/env bash
# build-images.sh OUTDIR [--binary PATH] [--dockerfile PATH] [--only NAME]... [--load DIR]
#
# Builds the images of the end-to-end tests as image tars without a container daemon:
#
#   OUTDIR/redlock-operator.tar  localhost/redlock-operator:e2e  the operator's static binary (--binary PATH, default
#       target/release/redlock-operator) in the image the Dockerfile's last stage defines, by scripts/image-archive.py
#       (the same builder as scripts/release.sh's image archive, which reads that stage and refuses an instruction
#       it cannot map; an OCI layout and a docker-archive in one tar). Needs neither the kit nor root. The binary
#       must be static (the image has no libraries):
#         cargo rustc --locked --release --bin redlock-operator -- -C target-feature=+crt-static
#   OUTDIR/redis.tar             localhost/redlock-redis:e2e    the machine's redis-server (Debian's package,
#       installed when missing) as /usr/local/bin/redis-server, what the chart's StatefulSet runs (`redis-server`
#       on PATH, as user 999, with /data and /tmp mounted and a read-only root filesystem).
#   OUTDIR/busybox.tar           busybox:1.36                   Debian's busybox-static with its applet symlinks
#       in /bin (the default image of the Job tests' pods: sleep, false, sh).
#   OUTDIR/app.tar               localhost/redlock-app:e2e      an application image as the docs tell users to
#       build one for pods that run `elect`, the Job guard or `lock`: busybox-static with its applet symlinks (a
#       shell, sleep) plus the operator binary (--binary) at /usr/local/bin/redlock-operator, as user 65532. The
#       in-cluster suite (tests/in_cluster.rs) runs the tutorials' pods on it.
# The last three are docker-archive tars by the k8s-node kit's mk-image.sh (${K8S_NODE_KIT:-<repo>/../shared/k8s-node}).
#
# --dockerfile PATH  the Dockerfile to read (default: the repository's)
# --only NAME        build only operator, redis, busybox or app (repeatable)
# --load DIR         then load the tars into the k8s-node cluster whose state is in DIR (load-image.sh DIR TAR...)
#
# A tar newer than all its inputs (binary, linked libraries, Dockerfile, this script, the builder) and built from
# the same recipe is kept. Progress goes to stderr; stdout is only the helm flags the chart needs for the images
# built, one per line (`--set image.repository=...`), so `helm install ... $(scripts/build-images.sh DIR)` works.
# Needs bash, python3, tar, and for the kit's images root (mk-image.sh sets file owners; packages are installed
# with apt-get).
set -euo pipefail

OPERATOR_TAG=localhost/redlock-operator:e2e
REDIS_TAG=localhost/redlock-redis:e2e
BUSYBOX_TAG=busybox:1.36

SCRIPT=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")
REPO=$(cd "$(dirname "$SCRIPT")/.." && pwd)
KIT=${K8S_NODE_KIT:-$REPO/../shared/k8s-node}

die() { echo "build-images.sh: $*" >&2; exit 1; }
say() { echo "build-images.sh: $*" >&2; }
usage() { sed -n '2,31p' "$SCRIPT" | sed 's/^# \{0,1\}//' >&2; exit 2; }

[ $# -ge 1 ] || usage
case $1 in -h | --help) usage ;; -*) die "the first argument is OUTDIR, got $1" ;; esac
OUTDIR=$1
shift
BINARY=$REPO/target/release/redlock-operator
DOCKERFILE=$REPO/Dockerfile
LOAD_DIR=
ONLY=()
while [ $# -gt 0 ]; do
  case $1 in
    --binary | --dockerfile | --only | --load) [ $# -ge 2 ] || die "$1 needs a value" ;;&
    --binary) BINARY=$2 ;;
    --dockerfile) DOCKERFILE=$2 ;;
    --only)
      case $2 in operator | redis | busybox | app) ONLY+=("$2") ;; *) die "--only: operator, redis, busybox or app, not '$2'" ;; esac ;;
    --load) LOAD_DIR=$2 ;;
    -h | --help) usage ;;
    *) die "unknown option $1 (see --help)" ;;
  esac
  shift 2
done
[ ${#ONLY[@]} -gt 0 ] || ONLY=(operator redis busybox app)
wanted() { [[ " ${ONLY[*]} " == *" $1 "* ]]; }

MK_IMAGE=$KIT/mk-image.sh
IMAGE_ARCHIVE=$REPO/scripts/image-archive.py
if wanted redis || wanted busybox || wanted app; then
  [ -x "$MK_IMAGE" ] || die "no $MK_IMAGE: set K8S_NODE_KIT to the k8s-node kit's folder (only the operator image needs none)"
fi
command -v python3 >/dev/null || die "python3 is needed (to read the Dockerfile and to edit the image config)"
mkdir -p "$OUTDIR"
OUTDIR=$(cd "$OUTDIR" && pwd)

# ---------------------------------------------------------------------------------------------------- helpers
# Adds ExposedPorts and Labels (JSON objects, empty: none) to the config of the docker-archive TAR, which mk-image.sh
# has no options for; the config's file is renamed after its new digest, the archive stays reproducible.
add_to_config() {
  python3 - "$@" <<'PY'
import hashlib, io, json, os, sys, tarfile

path, exposed, labels = sys.argv[1], sys.argv[2], sys.argv[3]
epoch = int(os.environ.get("SOURCE_DATE_EPOCH", "0"))
src = tarfile.open(path)
members = {m.name.removeprefix("./"): m for m in src.getmembers()}
manifest = json.loads(src.extractfile(members["manifest.json"]).read())
old_name = manifest[0]["Config"]
config = json.loads(src.extractfile(members[old_name]).read())
if exposed:
    config["config"]["ExposedPorts"] = json.loads(exposed)
if labels:
    config["config"]["Labels"] = json.loads(labels)
config_bytes = json.dumps(config, separators=(",", ":")).encode()
new_name = hashlib.sha256(config_bytes).hexdigest() + ".json"
manifest[0]["Config"] = new_name
manifest_bytes = json.dumps(manifest, separators=(",", ":")).encode()
replaced = {old_name: (new_name, config_bytes), "manifest.json": ("manifest.json", manifest_bytes)}

entries = []
for name, member in members.items():
    if name in replaced:
        new, data = replaced[name]
        info = tarfile.TarInfo("./" + new if member.name.startswith("./") else new)
        info.size, info.mode, info.mtime = len(data), member.mode, epoch
        entries.append((info.name, info, data))
    else:
        entries.append((member.name, member, None))
entries.sort(key=lambda e: (e[0] not in ("./", "."), e[0]))
with tarfile.open(path + ".tmp", "w", format=tarfile.GNU_FORMAT) as dst:
    for _, info, data in entries:
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        if data is not None:
            dst.addfile(info, io.BytesIO(data))
        elif info.isfile():
            dst.addfile(info, src.extractfile(info))
        else:
            dst.addfile(info)
src.close()
os.replace(path + ".tmp", path)
PY
}

# operator_archive OUT TAG ARGS...: the operator image, by scripts/image-archive.py (in mk-image.sh's argument order).
operator_archive() {
  local out=$1 tag=$2
  shift 2
  python3 "$IMAGE_ARCHIVE" build --out "$out" --name "$tag" "$@"
}

# The libraries `ldd` lists for a binary (what mk-image.sh's --bin copies), for the freshness check.
libraries() { { ldd "$1" 2>/dev/null || true; } | awk '/=> \// {print $3} $1 ~ /^\// {print $1}' | sort -u; }

# build BUILDER NAME TAG INPUTS-NEWLINE-SEPARATED EXPOSED LABELS BUILDER-ARGS...: OUTDIR/NAME.tar unless it is up to
# date (BUILDER OUT TAG BUILDER-ARGS...: mk-image.sh, or operator_archive).
build() {
  local builder=$1 name=$2 tag=$3 inputs=$4 exposed=$5 labels=$6
  shift 6
  local out=$OUTDIR/$name.tar recipe_file=$OUTDIR/.$name.tar.recipe recipe input
  recipe=$(printf '%s\n' "$builder" "$tag" "$@" "exposed=$exposed" "labels=$labels" "epoch=${SOURCE_DATE_EPOCH:-0}")
  if [ -f "$out" ] && [ -f "$recipe_file" ] && [ "$(cat "$recipe_file")" = "$recipe" ]; then
    local fresh=1
    while IFS= read -r input; do
      [ -z "$input" ] || [ "$out" -nt "$input" ] || { fresh=0; break; }
    done <<<"$inputs"
    if [ $fresh = 1 ]; then
      say "$name.tar ($tag) is up to date"
      return
    fi
  fi
  say "building $name.tar ($tag)"
  rm -f "$recipe_file"
  "$builder" "$out" "$tag" "$@" >&2
  if [ -n "$exposed$labels" ]; then add_to_config "$out" "$exposed" "$labels"; fi
  printf '%s\n' "$recipe" >"$recipe_file"
}

# install_package PACKAGE: apt-get install it (as root, where there is apt-get), or fail saying what is missing.
install_package() {
  [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 || die "Debian's $1 is missing: install it"
  say "installing $1 (apt-get)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq --no-install-recommends "$1" >/dev/null 2>&1 ||
    { apt-get update -qq >/dev/null && apt-get install -y -qq --no-install-recommends "$1" >/dev/null; } ||
    die "apt-get install $1 failed"
}

# A statically linked busybox (the image has no libraries for a dynamic one).
static_busybox() {
  local candidate
  for candidate in "$(command -v busybox || true)" /bin/busybox /usr/bin/busybox; do
    if [ -n "$candidate" ] && [ -x "$candidate" ] && ! ldd "$candidate" >/dev/null 2>&1; then
      echo "$candidate"
      return
    fi
  done
  return 1
}

# stage_busybox DIR: Debian's busybox-static (installed when missing) and its applet symlinks in DIR/bin; sets $busybox.
# Staged at a fixed path, so that the recipe (mk-image.sh's arguments) stays the same from one run to the next.
stage_busybox() {
  busybox=$(static_busybox) || { install_package busybox-static && busybox=$(static_busybox); } ||
    die "no static busybox after installing busybox-static"
  rm -rf "$1"
  mkdir -p "$1/bin"
  cp "$busybox" "$1/bin/busybox"
  local applet
  for applet in $("$busybox" --list); do [ "$applet" = busybox ] || ln -s busybox "$1/bin/$applet"; done
}

# ------------------------------------------------------------------------------------------------------ images
tars=()
helm_flags=()

if wanted operator; then
  [ -f "$DOCKERFILE" ] || die "no Dockerfile at $DOCKERFILE"
  [ -f "$BINARY" ] || die "no binary at $BINARY: see --help for the static build, or pass --binary PATH"
  build operator_archive redlock-operator "$OPERATOR_TAG" \
    "$(printf '%s\n' "$BINARY" "$DOCKERFILE" "$SCRIPT" "$IMAGE_ARCHIVE")" "" "" \
    --binary "$BINARY" --dockerfile "$DOCKERFILE"
  tars+=("$OUTDIR/redlock-operator.tar")
  helm_flags+=("--set image.repository=${OPERATOR_TAG%:*}" "--set image.tag=${OPERATOR_TAG##*:}")
fi

if wanted redis; then
  command -v redis-server >/dev/null 2>&1 || install_package redis-server
  redis=$(command -v redis-server)
  # The chart's StatefulSet: `redis-server` from PATH as 999:999 (the official image's `redis` user), working
  # directory /data (an emptyDir there; a read-only root filesystem elsewhere).
  # Also under the chart's default name (redis:<tag> of values.yaml, as Docker Hub names it), as a node that
  # pulled it has it: what a user applies unchanged (the release's static manifest) finds its masters' image.
  default_redis=$(awk '/^redis:/ { r = 1 } r && /^    repository:/ { repo = $2 } r && /^    tag:/ { gsub(/"/, "", $2); print repo ":" $2; exit }' \
    charts/redlock-operator/values.yaml)
  [ -n "$default_redis" ] || die "no redis.image in charts/redlock-operator/values.yaml"
  build "$MK_IMAGE" redis "$REDIS_TAG" "$(printf '%s\n' "$redis" "$SCRIPT" "$MK_IMAGE" charts/redlock-operator/values.yaml; libraries "$redis")" '{"6379/tcp":{}}' "" \
    --bin "$redis:/usr/local/bin/redis-server" --passwd redis:999 --user 999:999 --workdir /data \
    --cmd '["redis-server"]' --tag "docker.io/library/$default_redis"
  tars+=("$OUTDIR/redis.tar")
  helm_flags+=("--set redis.image.repository=${REDIS_TAG%:*}" "--set redis.image.tag=${REDIS_TAG##*:}")
fi

if wanted busybox; then
  stage=$OUTDIR/.busybox.root
  trap 'rm -rf "$OUTDIR/.busybox.root" "$OUTDIR/.app.root"' EXIT
  stage_busybox "$stage"
  build "$MK_IMAGE" busybox "$BUSYBOX_TAG" "$(printf '%s\n' "$busybox" "$SCRIPT" "$MK_IMAGE")" "" "" \
    --add "$stage/bin:/bin" --cmd '["sh"]'
  tars+=("$OUTDIR/busybox.tar")
fi

# ----------------------------------------------------------------------------------------------------- app image
# The application image of the in-cluster suite's tutorial pods (an addition of its own: nothing above depends on
# it). The docs tell users to copy the operator binary into their application image; here the application is a
# static busybox (sh, sleep), and the pods' examples set runAsNonRoot without a runAsUser, hence USER 65532.
APP_TAG=localhost/redlock-app:e2e
if wanted app; then
  [ -f "$BINARY" ] || die "no binary at $BINARY: cargo build --release --locked --bin redlock-operator, or pass --binary PATH"
  app_stage=$OUTDIR/.app.root
  trap 'rm -rf "$OUTDIR/.busybox.root" "$OUTDIR/.app.root"' EXIT
  stage_busybox "$app_stage"
  build "$MK_IMAGE" app "$APP_TAG" "$(printf '%s\n' "$BINARY" "$busybox" "$SCRIPT" "$MK_IMAGE"; libraries "$BINARY")" "" "" \
    --add "$app_stage/bin:/bin" --bin "$BINARY:/usr/local/bin/redlock-operator" --ca-certs \
    --user 65532:65532 --cmd '["sh"]'
  tars+=("$OUTDIR/app.tar")
fi

if [ -n "$LOAD_DIR" ]; then
  say "loading ${tars[*]} into $LOAD_DIR"
  "$KIT/load-image.sh" "$LOAD_DIR" "${tars[@]}" >&2
fi
[ ${#helm_flags[@]} -eq 0 ] || printf '%s\n' "${helm_flags[@]}"
