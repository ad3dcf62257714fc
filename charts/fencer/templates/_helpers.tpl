{{- define "fencer.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 50 | trimSuffix "-" -}}
{{- end -}}

{{- define "fencer.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "fencer.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "fencer.labels" -}}
app.kubernetes.io/name: {{ include "fencer.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- /* fencer.io/lease fences the object it labels, and fencer's own objects
must never be fenced: the writes fencer, the kubelet and Helm make to
them send no token, so the webhook would refuse them, the manager's pods
included (a ReplicaSet's tokenless pod CREATE), and fencer could not
start. So no label value of the chart may set it (checked once, by
values-check.yaml). */}}
{{- define "fencer.refuseFenceLabel" -}}
{{- $m := .Values.metrics -}}
{{- $maps := dict "commonLabels" .Values.commonLabels "podLabels" .Values.podLabels "metrics.serviceMonitor.labels" $m.serviceMonitor.labels "metrics.podMonitor.labels" $m.podMonitor.labels "metrics.prometheusRule.labels" $m.prometheusRule.labels "metrics.dashboard.labels" $m.dashboard.labels -}}
{{- range $value, $labels := $maps -}}
{{- if hasKey ($labels | default dict) "fencer.io/lease" -}}
{{- fail (printf "%s sets the label fencer.io/lease, which would fence fencer's own objects: the webhook would refuse the writes Helm, the kubelet and fencer make to them without a token (for the manager's pods, their very creation). Remove it from %s." $value $value) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "fencer.selectorLabels" -}}
app.kubernetes.io/name: {{ include "fencer.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: manager
{{- end -}}

{{- define "fencer.etcdSelectorLabels" -}}
app.kubernetes.io/name: {{ include "fencer.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: etcd
{{- end -}}

{{- define "fencer.backupSelectorLabels" -}}
app.kubernetes.io/name: {{ include "fencer.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: etcd-backup
{{- end -}}

{{- define "fencer.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "fencer.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The manager's username as the apiserver sees it, which the admission policies name. */}}
{{- define "fencer.managerUsername" -}}
system:serviceaccount:{{ .Release.Namespace }}:{{ include "fencer.serviceAccountName" . }}
{{- end -}}

{{- define "fencer.image" -}}
"{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}"
{{- end -}}

{{/* Names of the bundled etcd and of the Secrets that lock it down. */}}
{{- define "fencer.etcdName" -}}{{ include "fencer.fullname" . }}-etcd{{- end -}}
{{- define "fencer.etcdCASecret" -}}{{ include "fencer.fullname" . }}-etcd-ca{{- end -}}
{{- define "fencer.etcdServerSecret" -}}{{ include "fencer.fullname" . }}-etcd-server{{- end -}}
{{- define "fencer.etcdViewerSecret" -}}{{ include "fencer.fullname" . }}-etcd-viewer{{- end -}}
{{- define "fencer.etcdBackupSecret" -}}{{ include "fencer.fullname" . }}-etcd-backup{{- end -}}
{{- define "fencer.etcdCredentialsSecret" -}}{{ include "fencer.fullname" . }}-etcd-client{{- end -}}
{{- define "fencer.webhookConfig" -}}{{ include "fencer.fullname" . }}-fencing{{- end -}}

{{/* The etcd client URLs: external, or the bundled StatefulSet's members. */}}
{{- define "fencer.etcdEndpoints" -}}
{{- if .Values.etcd.endpoints -}}
{{- join "," .Values.etcd.endpoints -}}
{{- else -}}
{{- $name := include "fencer.etcdName" . -}}
{{- $eps := list -}}
{{- range $i := until (int .Values.etcd.bundled.replicas) -}}
{{- $eps = append $eps (printf "https://%s-%d.%s.%s.svc:2379" $name $i $name $.Release.Namespace) -}}
{{- end -}}
{{- join "," $eps -}}
{{- end -}}
{{- end -}}

{{/* The names the bundled members' certificate is for. */}}
{{- define "fencer.etcdServerNames" -}}
{{- $name := include "fencer.etcdName" . -}}
{{- $ns := .Release.Namespace -}}
{{- list (printf "*.%s.%s.svc" $name $ns) (printf "*.%s.%s.svc.cluster.local" $name $ns) (printf "%s.%s.svc" $name $ns) "localhost" "127.0.0.1" | join "," -}}
{{- end -}}

{{- define "fencer.webhookService" -}}{{ include "fencer.fullname" . }}-webhook{{- end -}}
{{- define "fencer.webhookSecret" -}}{{ include "fencer.fullname" . }}-webhook-cert{{- end -}}

{{- /* fencer.durationMs is a Go duration of the chart's values (the
schema's pattern: numbers with ms, s, m or h, e.g. 1m30s) in
milliseconds, for comparing durations at render time. */ -}}
{{- define "fencer.durationMs" -}}
{{- $ms := 0.0 -}}
{{- range regexFindAll "[0-9]+(\\.[0-9]+)?(ms|s|m|h)" (toString .) -1 -}}
{{- $unit := regexFind "(ms|s|m|h)$" . -}}
{{- $ms = addf $ms (mulf (float64 (trimSuffix $unit .)) (get (dict "ms" 1.0 "s" 1000.0 "m" 60000.0 "h" 3600000.0) $unit)) -}}
{{- end -}}
{{- $ms -}}
{{- end -}}
