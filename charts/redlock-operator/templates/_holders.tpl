{{/* The admissionregistration.k8s.io version of the holder-injection MutatingAdmissionPolicies, or nothing when
     they are off: holders.injection `auto` takes v1 where the cluster serves it (Kubernetes 1.36+). */}}
{{- define "redlock-operator.holders.injectionVersion" -}}
{{- $mode := .Values.holders.injection }}
{{- if eq $mode "auto" }}
{{- if .Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy" }}v1{{ end }}
{{- else if ne $mode "off" }}
{{- $mode }}
{{- end }}
{{- end }}

{{/* Whether every ServiceAccount of the cluster gets the holder ClusterRole: holders.namespaces is null and
     operator.lockNamespaces is empty (the installation keeps locks in every namespace). */}}
{{- define "redlock-operator.holders.everywhere" -}}
{{- and (kindIs "invalid" .Values.holders.namespaces) (empty .Values.operator.lockNamespaces) }}
{{- end }}

{{/* The namespaces whose ServiceAccounts get the holder ClusterRole by a RoleBinding: holders.namespaces, or
     operator.lockNamespaces when that is null. */}}
{{- define "redlock-operator.holders.namespaces" -}}
{{- if kindIs "invalid" .Values.holders.namespaces }}
{{- toJson (default list .Values.operator.lockNamespaces) }}
{{- else }}
{{- toJson .Values.holders.namespaces }}
{{- end }}
{{- end }}

{{/* CEL literals of the injected parts, typed for the pod spec at .type (Object.spec or Object.spec.template.spec):
     the init container that copies the binary, the volumes, the chosen container's mounts and environment. */}}
{{- define "redlock-operator.holders.initContainer" -}}
{{ .type }}.initContainers{name: 'redlock-binary', image: {{ .image | squote }}, imagePullPolicy: {{ .Values.image.pullPolicy | squote }},
  command: ['/usr/local/bin/redlock-operator', 'copy-binary', '/redlock/redlock-operator'],
  resources: {{ .type }}.initContainers.resources{
    requests: { {{- range $k, $v := .Values.holders.initContainer.resources.requests }}{{ $k | squote }}: {{ $v | toString | squote }}, {{ end -}} },
    limits: { {{- range $k, $v := .Values.holders.initContainer.resources.limits }}{{ $k | squote }}: {{ $v | toString | squote }}, {{ end -}} }},
  securityContext: {{ .type }}.initContainers.securityContext{runAsNonRoot: true, runAsUser: {{ .Values.holders.initContainer.runAsUser | int }},
    allowPrivilegeEscalation: false, readOnlyRootFilesystem: true,
    capabilities: {{ .type }}.initContainers.securityContext.capabilities{drop: ['ALL']},
    seccompProfile: {{ .type }}.initContainers.securityContext.seccompProfile{type: 'RuntimeDefault'}},
  volumeMounts: [{{ .type }}.initContainers.volumeMounts{name: 'redlock-binary', mountPath: '/redlock'}]}
{{- end }}

{{- define "redlock-operator.holders.volumes" -}}
[{{ .type }}.volumes{name: 'redlock-binary', emptyDir: {{ .type }}.volumes.emptyDir{}},
 {{ .type }}.volumes{name: 'redlock-token', projected: {{ .type }}.volumes.projected{sources: [
   {{ .type }}.volumes.projected.sources{serviceAccountToken: {{ .type }}.volumes.projected.sources.serviceAccountToken{
     audience: 'redlock-operator', expirationSeconds: 3600, path: 'token'}}]}}]
{{- end }}

{{- define "redlock-operator.holders.pullSecrets" -}}
[{{ range $i, $s := .Values.holders.imagePullSecrets }}{{ if $i }}, {{ end }}{{ $.type }}.imagePullSecrets{name: {{ $s | squote }}}{{ end }}]
{{- end }}

{{- define "redlock-operator.holders.mounts" -}}
[{{ .type }}.containers.volumeMounts{name: 'redlock-binary', mountPath: '/redlock', readOnly: true},
 {{ .type }}.containers.volumeMounts{name: 'redlock-token', mountPath: '/var/run/secrets/redlock.io', readOnly: true}]
{{- end }}

{{- define "redlock-operator.holders.env" -}}
{{- $t := .type }}
{{- $fields := list (list "POD_NAMESPACE" "metadata.namespace") }}
{{- if eq .kind "pods" }}
{{- $fields = append $fields (list "POD_NAME" "metadata.name") }}
{{- else }}
{{- $fields = append $fields (list "JOB_NAME" "metadata.labels['batch.kubernetes.io/job-name']") }}
{{- $fields = append $fields (list "REDLOCK_GRANTED_TOKEN" "metadata.annotations['redlock.io/fencing-token']") }}
{{- $fields = append $fields (list "REDLOCK_GRANTED_PERMIT" "metadata.annotations['redlock.io/permit']") }}
{{- end -}}
[{{ range $i, $f := $fields }}{{ if $i }},
 {{ end }}{{ $t }}.containers.env{name: {{ index $f 0 | squote }}, valueFrom: {{ $t }}.containers.env.valueFrom{fieldRef: {{ $t }}.containers.env.valueFrom.fieldRef{fieldPath: {{ index $f 1 | quote }}}}}{{ end }}]
{{- end }}

{{/* The Job's podFailurePolicy rules: the guard's exit 76 (it stopped the work when the grant ended) is no failure
     of the work, nor is a pod the Job's suspension or a node's drain took away. */}}
{{- define "redlock-operator.holders.exitRule" -}}
Object.spec.podFailurePolicy.rules{action: 'Ignore', onExitCodes: Object.spec.podFailurePolicy.rules.onExitCodes{containerName: string(variables.wanted), operator: 'In', values: [76]}}
{{- end }}

{{- define "redlock-operator.holders.disruptionRule" -}}
Object.spec.podFailurePolicy.rules{action: 'Ignore', onPodConditions: [Object.spec.podFailurePolicy.rules.onPodConditions{type: 'DisruptionTarget', status: 'True'}]}
{{- end }}
