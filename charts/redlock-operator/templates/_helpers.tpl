{{/* Chart name, truncated for DNS labels. */}}
{{- define "redlock-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Fully qualified app name: `<release>-<chart>`, or the release name when it already contains the chart name. */}}
{{- define "redlock-operator.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "redlock-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels on every object. */}}
{{- define "redlock-operator.labels" -}}
helm.sh/chart: {{ include "redlock-operator.chart" . }}
app.kubernetes.io/name: {{ include "redlock-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: redlock-operator
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Labels that never change with the chart's version or commonLabels, for the embedded masters' pod template:
     a change there restarts every master (each sits out its quarantine, quorum.maxTtl), so only what the masters
     themselves need goes in it (redis.podLabels, on purpose). */}}
{{- define "redlock-operator.stableLabels" -}}
app.kubernetes.io/name: {{ include "redlock-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: redlock-operator
{{- end }}

{{/* Selector labels of the operator pods. */}}
{{- define "redlock-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "redlock-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{/* Selector labels of the embedded Redis masters. */}}
{{- define "redlock-operator.redis.selectorLabels" -}}
app.kubernetes.io/name: {{ include "redlock-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: redis
{{- end }}

{{/* Selector labels of the `helm test` Pod. */}}
{{- define "redlock-operator.testSelectorLabels" -}}
app.kubernetes.io/name: {{ include "redlock-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: test
{{- end }}

{{/* The one namespace quorum Secrets are read from (and the only one the operator may read Secrets in). */}}
{{- define "redlock-operator.secretsNamespace" -}}
{{- default .Release.Namespace .Values.operator.secretsNamespace }}
{{- end }}

{{- define "redlock-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "redlock-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "redlock-operator.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}
{{- end }}

{{- define "redlock-operator.redis.image" -}}
{{- if .Values.redis.image.digest }}
{{- printf "%s@%s" .Values.redis.image.repository .Values.redis.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.redis.image.repository .Values.redis.image.tag }}
{{- end }}
{{- end }}

{{- define "redlock-operator.leaseName" -}}
{{- default (include "redlock-operator.fullname" .) .Values.operator.leaseName }}
{{- end }}

{{- define "redlock-operator.installationSecretName" -}}
{{- default (printf "%s-installation" (include "redlock-operator.fullname" .)) .Values.installationSecret.existingSecret }}
{{- end }}

{{/* "true" when the chart runs its own Redis masters. */}}
{{- define "redlock-operator.redis.embedded" -}}
{{- if not .Values.redis.external.endpoints }}true{{ end }}
{{- end }}

{{/* StatefulSet and headless Service name; 52 characters leave room for the controller-revision-hash label. */}}
{{- define "redlock-operator.redis.fullname" -}}
{{- printf "%s-redis" (include "redlock-operator.fullname" .) | trunc 52 | trimSuffix "-" }}
{{- end }}

{{- define "redlock-operator.redis.secretName" -}}
{{- printf "%s-redis-auth" (include "redlock-operator.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The embedded masters' URLs, one per StatefulSet pod, as a JSON list. */}}
{{- define "redlock-operator.redis.endpoints" -}}
{{- $name := include "redlock-operator.redis.fullname" . }}
{{- $urls := list }}
{{- range $i := until (int .Values.redis.replicas) }}
{{- $urls = append $urls (printf "redis://%s-%d.%s.%s.svc.%s:6379" $name $i $name $.Release.Namespace $.Values.clusterDomain) }}
{{- end }}
{{- toJson $urls }}
{{- end }}

{{/* A duration in the CRDs' form, Go's (`1m30s`, `500ms`, `1.5s`), as whole milliseconds (rounded down). */}}
{{- define "redlock-operator.durationMs" -}}
{{- $total := 0.0 }}
{{- if not (regexMatch "^[+]?(0|(([0-9]+([.][0-9]*)?|[.][0-9]+)(ns|us|µs|μs|ms|s|m|h))+)$" .) }}
{{- fail (printf "%q is not a duration like 60s, 1m30s, 1.5s or 500ms" .) }}
{{- end }}
{{- range $part := regexFindAll "([0-9]+([.][0-9]*)?|[.][0-9]+)(ns|us|µs|μs|ms|s|m|h)" . -1 }}
{{- $number := regexFind "^([0-9]+([.][0-9]*)?|[.][0-9]+)" $part }}
{{- $unit := trimPrefix $number $part }}
{{- $factor := get (dict "ns" 0.000001 "us" 0.001 "µs" 0.001 "μs" 0.001 "ms" 1.0 "s" 1000.0 "m" 60000.0 "h" 3600000.0) $unit }}
{{- $total = addf $total (mulf (float64 $number) $factor) }}
{{- end }}
{{- floor $total | int64 }}
{{- end }}

{{/* Seconds a restarted master stays quarantined, rounded up, plus a margin: maxTtl × (1 + drift) + 2 ms, and
     the one second by which Redis may over-report its uptime. */}}
{{- define "redlock-operator.redis.readinessDelaySeconds" -}}
{{- if kindIs "invalid" .Values.redis.readinessDelaySeconds }}
{{- $ms := include "redlock-operator.durationMs" .Values.quorum.maxTtl | float64 }}
{{- $quarantine := addf (mulf $ms (addf 1.0 (.Values.quorum.driftFactor | float64))) 2.0 }}
{{- add (ceil (divf $quarantine 1000.0) | int) 3 }}
{{- else }}
{{- .Values.redis.readinessDelaySeconds | int }}
{{- end }}
{{- end }}

{{/* CEL: the request comes from a redlock operator, of this installation or of another one in the cluster: a
     ServiceAccount allowed the verb `grant` on the request namespace's DistributedLocks (each release's ClusterRole
     gives it to its operator; no user or built-in role names it, only a `*` does). By this rather than by this
     release's ServiceAccount name, two releases' admission policies agree on who may let a Job run or write past a
     fence: each operator keeps its own locks (the redlock.io/installation annotation), and neither's policies
     refuse the other's writes. */}}
{{- define "redlock-operator.byAnOperator" -}}
request.userInfo.username.startsWith('system:serviceaccount:') && authorizer.group('redlock.io').resource('distributedlocks').namespace(request.namespace).check('grant').allowed()
{{- end }}

{{/* The admission policy bindings' namespaceSelector: the namespaces of operator.lockNamespaces when it is set
     (the installation keeps no lock elsewhere, so its policies act nowhere else), nothing otherwise. */}}
{{- define "redlock-operator.policyNamespaceSelector" -}}
{{- with .Values.operator.lockNamespaces -}}
matchResources:
  namespaceSelector:
    matchExpressions:
      - key: kubernetes.io/metadata.name
        operator: In
        values:
          {{- toYaml . | nindent 10 }}
{{- end }}
{{- end }}
