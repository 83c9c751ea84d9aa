#!/usr/bin/env python3
"""Compares what the operator asked the API server for with what the chart's roles grant.

The end-to-end tests record each (API group, resource, verb) the operator's own client requests from the test API
server (REDLOCK_RBAC_RECORD_DIR, one `group resource verb` per line, `core` for the core group). Every recorded
request must be granted by a rule of a ClusterRole or Role in the rendered chart, and every (group, resource,
verb) a rule grants must have been requested at least once: the chart grants exactly what the code calls.

Usage: rbac_check.py RENDER.yaml RECORD_DIR
"""

import glob
import os
import sys

import yaml


# Granted for the chart's admission policies to ask of the authorizer (who is an operator: `redlock-operator.byAnOperator`
# in _helpers.tpl), never requested of the API server.
NOT_API_VERBS = {("redlock.io", "distributedlocks", "grant")}


def granted(render):
    """(group, resource, verb) -> the role that grants it."""
    grants = {}
    with open(render) as handle:
        for obj in yaml.safe_load_all(handle):
            if not obj or obj.get("kind") not in ("ClusterRole", "Role"):
                continue
            role = f"{obj['kind']} {obj['metadata']['name']}"
            for rule in obj.get("rules", []):
                for group in rule.get("apiGroups", []):
                    for resource in rule.get("resources", []):
                        for verb in rule.get("verbs", []):
                            grants[(group or "core", resource, verb)] = role
    return grants


def requested(record_dir):
    seen = set()
    for path in glob.glob(os.path.join(record_dir, "requests-*.txt")):
        with open(path) as handle:
            for line in handle:
                fields = line.split()
                if len(fields) == 3:
                    seen.add(tuple(fields))
    return seen


def main():
    render, record_dir = sys.argv[1], sys.argv[2]
    grants = granted(render)
    seen = requested(record_dir)
    if not seen:
        print(f"no recorded requests in {record_dir}: run the tests with REDLOCK_RBAC_RECORD_DIR set first")
        return 1
    problems = []
    for group, resource, verb in sorted(seen):
        if (group, resource, verb) not in grants:
            problems.append(f"requested but not granted: {verb} {resource} ({group})")
    for (group, resource, verb), role in sorted(grants.items()):
        if (group, resource, verb) in NOT_API_VERBS:
            continue
        if (group, resource, verb) not in seen:
            problems.append(f"granted by {role} but never requested: {verb} {resource} ({group})")
    for problem in problems:
        print(problem)
    print(f"{len(seen)} requests recorded, {len(grants)} grants, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
