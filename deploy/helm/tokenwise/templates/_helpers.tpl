{{/* The prefix of every object's name: the release's name, with the chart's name when the release lacks it. */}}
{{- define "tokenwise.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "tokenwise.selectorLabels" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "tokenwise.labels" -}}
{{ include "tokenwise.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version }}
{{- end -}}

{{- define "tokenwise.panelImage" -}}
{{ .Values.image.panel.repository }}:{{ .Values.image.panel.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "tokenwise.gpuImage" -}}
{{ .Values.image.gpuWorker.repository }}:{{ .Values.image.gpuWorker.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "tokenwise.secretRef" -}}
valueFrom:
  secretKeyRef:
    name: {{ required (printf "%s: name the Secret that holds it" .what) .ref.name }}
    key: {{ required (printf "%s: name the Secret's key that holds it" .what) .ref.key }}
{{- end -}}

{{/* The settings every container reads (compose.yaml's x-panel-env); the component adds its own after these. */}}
{{- define "tokenwise.env" -}}
{{- $reserved := list "DATABASE_URL" "REDIS_URL" "SECRET_KEY" "TOKENWISE_ENCRYPTION_KEYS" "TOKENWISE_METRICS_TOKEN"
      "TOKENWISE_DATA_DIR" "TOKENWISE_HOST_NAME" "TOKENWISE_ENGINE_BIND" "TOKENWISE_ENGINE_ADVERTISE_HOST"
      "TOKENWISE_WEB_PROCESSES" "TOKENWISE_STATIC_ROOT" "PROMETHEUS_MULTIPROC_DIR" "TOKENWISE_WORKER_CONCURRENCY"
      "TOKENWISE_LONG_CONCURRENCY" "TOKENWISE_GPU_CONCURRENCY" -}}
{{- range $name := $reserved }}
{{- if hasKey $.Values.config $name }}
{{- fail (printf "config.%s: the chart sets %s itself; give it through the chart's own value (see values.yaml)" $name $name) }}
{{- end }}
{{- end -}}
- name: DATABASE_URL
  {{- include "tokenwise.secretRef" (dict "what" "postgresql.urlSecret" "ref" .Values.postgresql.urlSecret) | nindent 2 }}
- name: REDIS_URL
{{- if .Values.redis.url }}
  value: {{ .Values.redis.url | quote }}
{{- else }}
  {{- include "tokenwise.secretRef" (dict "what" "redis.urlSecret" "ref" .Values.redis.urlSecret) | nindent 2 }}
{{- end }}
- name: SECRET_KEY
  {{- include "tokenwise.secretRef" (dict "what" "secrets.secretKey" "ref" .Values.secrets.secretKey) | nindent 2 }}
- name: TOKENWISE_ENCRYPTION_KEYS
  {{- include "tokenwise.secretRef" (dict "what" "secrets.encryptionKeys" "ref" .Values.secrets.encryptionKeys) | nindent 2 }}
- name: TOKENWISE_METRICS_TOKEN
  {{- include "tokenwise.secretRef" (dict "what" "secrets.metricsToken" "ref" .Values.secrets.metricsToken) | nindent 2 }}
- name: TOKENWISE_DATA_DIR
  value: /data
{{- range $name, $value := .Values.config }}
- name: {{ $name }}
  value: {{ $value | toString | quote }}
{{- end }}
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* A worker or beat names itself after its pod: Celery's node names (default@<pod>) stay unique across replicas. */}}
{{- define "tokenwise.podHostName" -}}
- name: TOKENWISE_HOST_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
{{- end -}}

{{- define "tokenwise.dataVolume" -}}
- name: data
  persistentVolumeClaim:
    claimName: {{ .Values.persistence.existingClaim | default (printf "%s-data" (include "tokenwise.fullname" .)) }}
{{- end -}}

{{- define "tokenwise.podCommon" -}}
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* Celery's own health check, as compose runs it: the worker answers a ping through the broker. */}}
{{- define "tokenwise.workerProbe" -}}
livenessProbe:
  exec:
    command: ["sh", "-c", "python -m celery -A workers inspect ping -d {{ . }}@$TOKENWISE_HOST_NAME --timeout 10"]
  initialDelaySeconds: 60
  periodSeconds: 60
  timeoutSeconds: 30
  failureThreshold: 3
{{- end -}}
