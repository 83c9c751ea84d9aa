#!/usr/bin/env python3
"""scripts/static-manifest.py RENDERED VERSION NAMESPACE > redlock-operator-<version>.yaml

Turns the chart as `helm template --include-crds --skip-tests` rendered it with its defaults (scripts/release.sh)
into the release's static manifest, for `kubectl apply --server-side -f` without Helm:

- the Namespace first (helm template renders none);
- the two Secrets the chart generates left out (the installation secret, the embedded masters' password and ACL):
  a file everybody downloads must not carry one installation's secrets. The header gives the commands that make
  them, with values of each installation's own, the ACL line exactly as the chart renders it (its disabled
  commands), the password put in by the shell;
- everything else as rendered, in Helm's order (CRDs first).

Fails when the rendering holds no such Secret, or its ACL line does not carry the generated password once.
"""

import base64
import re
import sys


def documents(text):
    """Helm's rendering split into its documents (each starts with `---`), empty ones left out."""
    return [doc for doc in re.split(r"^---[ \t]*$\n?", text, flags=re.M) if doc.strip(" \n") and re.search(r"^kind:", doc, re.M)]


def field(doc, pattern):
    found = re.search(pattern, doc, re.M)
    return found.group(1) if found else None


def main():
    rendered, version, namespace = sys.argv[1:4]
    with open(rendered, encoding="utf-8") as f:
        docs = documents(f.read())
    kept, secrets = [], {}
    for doc in docs:
        component = field(doc, r"^\s+app\.kubernetes\.io/component:\s*(\S+)")
        if field(doc, r"^kind:\s*(\S+)") == "Secret" and component in ("operator", "redis"):
            secrets[component] = doc
        else:
            kept.append(doc)
    if set(secrets) != {"operator", "redis"}:
        sys.exit(f"static-manifest.py: expected the installation and the masters' Secrets, found {sorted(secrets)}")
    name = r"^  name:\s*(\S+)"
    installation_name = field(secrets["operator"], name)
    installation_key = field(secrets["operator"], r"^data:\n  ([^:\s]+):")
    redis_name = field(secrets["redis"], name)
    password = base64.b64decode(field(secrets["redis"], r"^  password:\s*(\S+)")).decode()
    acl = base64.b64decode(field(secrets["redis"], r"^  users\.conf:\s*(\S+)")).decode().rstrip("\n")
    if not (installation_name and installation_key and redis_name):
        sys.exit("static-manifest.py: a generated Secret without its name or key")
    if acl.count(f">{password}") != 1 or "\n" in acl or '"' in acl or "$" in acl:
        sys.exit("static-manifest.py: the masters' ACL line does not carry the generated password once")
    acl = acl.replace(f">{password}", ">$password")
    manifest = f"redlock-operator-{version}.yaml"
    header = f"""\
# redlock-operator {version}: the Helm chart's default installation as one manifest, for clusters deployed
# without Helm. It is the chart rendered with its defaults (release `redlock`, namespace {namespace}, holder
# injection by MutatingAdmissionPolicy admissionregistration.k8s.io/v1: Kubernetes 1.36 or later; elsewhere use
# the chart). The two Secrets the chart generates are left out: make your own first, then apply the file:
#
#   kubectl create namespace {namespace}
#   kubectl -n {namespace} create secret generic {installation_name} \\
#     --from-literal={installation_key}="$(head -c 48 /dev/urandom | base64 | tr -d '\\n')"
#   password=$(head -c 30 /dev/urandom | base64 | tr -dc 'A-Za-z0-9')
#   kubectl -n {namespace} create secret generic {redis_name} --from-literal=password="$password" \\
#     --from-literal=users.conf="{acl}"
#   kubectl apply --server-side -f {manifest}
#
# Keep the installation secret: a new one makes every held lock lapse once (docs/how-to/install.md#without-helm).
"""
    out = [header, f"---\napiVersion: v1\nkind: Namespace\nmetadata:\n  name: {namespace}\n"]
    for doc in kept:
        out.append("---" + ("" if doc.startswith("\n") else "\n") + doc.rstrip("\n") + "\n")
    sys.stdout.write("".join(out))


if __name__ == "__main__":
    main()
