{{- define "fencer.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "fencer.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "fencer.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: manager
{{- end -}}

{{- define "fencer.etcdSelectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: etcd
{{- end -}}

{{/* The etcd client URLs: external, or the bundled StatefulSet's members. */}}
{{- define "fencer.etcdEndpoints" -}}
{{- if .Values.etcd.endpoints -}}
{{- join "," .Values.etcd.endpoints -}}
{{- else -}}
{{- $name := printf "%s-etcd" (include "fencer.fullname" .) -}}
{{- $eps := list -}}
{{- range $i := until (int .Values.etcd.bundled.replicas) -}}
{{- $eps = append $eps (printf "%s://%s-%d.%s.%s.svc:2379" (include "fencer.etcdScheme" $) $name $i $name $.Release.Namespace) -}}
{{- end -}}
{{- join "," $eps -}}
{{- end -}}
{{- end -}}

{{- define "fencer.webhookService" -}}{{ include "fencer.fullname" . }}-webhook{{- end -}}
{{- define "fencer.webhookSecret" -}}{{ include "fencer.fullname" . }}-webhook-cert{{- end -}}

{{- define "fencer.etcdScheme" -}}{{ if .Values.etcd.bundled.tlsSecret }}https{{ else }}http{{ end }}{{- end -}}

{{/* The Secret the manager's etcd client TLS comes from, if any. */}}
{{- define "fencer.etcdClientTLS" -}}
{{- if .Values.etcd.endpoints -}}{{ .Values.etcd.tlsSecret }}{{- else -}}{{ .Values.etcd.bundled.tlsSecret }}{{- end -}}
{{- end -}}
