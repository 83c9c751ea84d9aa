#!/usr/bin/env python3
"""A holder's fenced write with the official Kubernetes Python client (the `kubernetes` package).

    fenced-write.py [--namespace NAMESPACE] CONFIGMAP KEY=VALUE...

Sets keys of a ConfigMap labelled `redlock.io/fenced-by: <lock>` and the annotation `redlock.io/fencing-token` in one
merge patch, so that the chart's fenced-objects policy judges the change by this holder's token ("Fenced objects" in
docs/explanation/hand-over-and-fencing.md). Run it under `redlock-operator lock`, `elect` or the guard. The token is
read at each write: from the file REDLOCK_FENCING_TOKEN_FILE names when that is set (kept current across grants),
else from REDLOCK_FENCING_TOKEN. Exits 1 with the API server's message when the write is refused (403: a later
holder's token is in force, stop working), 2 on any other failure (no token, no cluster, no such ConfigMap).
"""

import argparse
import json
import os
import sys

import urllib3
from kubernetes import client, config
from kubernetes.client.rest import ApiException

TOKEN_ANNOTATION = "redlock.io/fencing-token"
TOKEN_FILE_ENV = "REDLOCK_FENCING_TOKEN_FILE"
TOKEN_ENV = "REDLOCK_FENCING_TOKEN"
SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


class Failure(Exception):
    """Anything but a refusal: exit 2."""


def current_token():
    """This holder's token now. With REDLOCK_FENCING_TOKEN_FILE set, the file alone counts: no file means no grant
    at this moment (the command it was written for has ended), and the variable may hold an older grant's token."""
    path = os.environ.get(TOKEN_FILE_ENV)
    if path:
        try:
            with open(path, encoding="ascii") as file:
                text, source = file.read(), TOKEN_FILE_ENV
        except (OSError, UnicodeDecodeError) as error:
            raise Failure(f"no current grant: {TOKEN_FILE_ENV} names {path}, which cannot be read: {error}")
    elif TOKEN_ENV in os.environ:
        text, source = os.environ[TOKEN_ENV], TOKEN_ENV
    else:
        raise Failure(f"no fencing token ({TOKEN_ENV} or {TOKEN_FILE_ENV}): run this under redlock-operator lock, "
                      "elect or guard")
    digits = text.strip()
    # The policy takes only ASCII digits (str.isdigit would also take other scripts' digits).
    if not digits or not all("0" <= c <= "9" for c in digits):
        raise Failure(f"{source} gives {digits!r}, not a fencing token (decimal digits)")
    return digits


def connect():
    """In a pod, its service account and namespace; elsewhere the kubeconfig's current context and its namespace."""
    try:
        config.load_incluster_config()
        with open(SERVICE_ACCOUNT_NAMESPACE, encoding="utf-8") as file:
            return file.read().strip()
    except config.ConfigException:
        pass
    try:
        config.load_kube_config()
        _, current = config.list_kube_config_contexts()
    except (config.ConfigException, OSError) as error:
        raise Failure(f"no Kubernetes client (in-cluster or kubeconfig): {error}")
    return current["context"].get("namespace", "default")


def fenced_write(core, namespace, name, data):
    """One fenced write; returns the token it was written with. Raises ApiException as the API server answered."""
    # Read right before the write, not once at start: a process that outlives one grant must send the current one.
    token = current_token()
    # The change and the token in the same request: a change sent without its token would be judged by the token
    # the object already carries (the last writer's), and a token sent alone would not cover the change.
    patch = {"metadata": {"annotations": {TOKEN_ANNOTATION: token}}, "data": data}
    # A merge patch, as kubectl --type merge sends; the client's default for a dict is a strategic merge patch.
    core.patch_namespaced_config_map(name, namespace, patch, _content_type="application/merge-patch+json")
    return token


def key_value(argument):
    key, separator, value = argument.partition("=")
    if not separator:
        raise argparse.ArgumentTypeError(f"{argument!r} is not KEY=VALUE")
    return key, value


def api_message(error):
    """The message of the API server's Status, or what the client saw when there is none."""
    try:
        return json.loads(error.body)["message"]
    except (TypeError, ValueError, KeyError):
        return f"{error.status} {error.reason}"


def main():
    parser = argparse.ArgumentParser(description="Writes a fenced ConfigMap's data with this holder's fencing token")
    parser.add_argument("-n", "--namespace", help="the ConfigMap's namespace (default: the context's, or the pod's)")
    parser.add_argument("config_map", metavar="CONFIGMAP")
    parser.add_argument("data", metavar="KEY=VALUE", nargs="+", type=key_value)
    args = parser.parse_args()
    try:
        connected_namespace = connect()
        namespace = args.namespace or connected_namespace
        token = fenced_write(client.CoreV1Api(), namespace, args.config_map, dict(args.data))
    except Failure as failure:
        print(f"fenced-write: {failure}", file=sys.stderr)
        return 2
    except urllib3.exceptions.HTTPError as error:
        print(f"fenced-write: no answer from the API server: {error}", file=sys.stderr)
        return 2
    except ApiException as error:
        if error.status == 403:
            print(f"fenced-write: refused: {api_message(error)}", file=sys.stderr)
            return 1
        print(f"fenced-write: writing configmap {args.config_map}: {api_message(error)}", file=sys.stderr)
        return 2
    print(f"configmap {args.config_map} written with fencing token {token}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
