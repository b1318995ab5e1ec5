{{/*
The name prefix of every object: the release name when it is "firstpacket" or contains
it, else "<release>-firstpacket" (cluster-scoped objects and the Node-Events Role in
`default` must differ between installs).
*/}}
{{- define "firstpacket.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Labels that select the prober pods (the same as the kustomize base's). */}}
{{- define "firstpacket.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}-prober
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: prober
{{- end -}}

{{/* Every object's labels: the selector labels plus Helm's bookkeeping. */}}
{{- define "firstpacket.labels" -}}
{{ include "firstpacket.selectorLabels" . }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end -}}

{{/* Labels of objects that are not the prober's pods' (RBAC): without `component`. */}}
{{- define "firstpacket.commonLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end -}}
