{{/* The chart name, overridable. */}}
{{- define "mmfleet.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name of the release's objects: the release name, with the chart name unless it already contains it. */}}
{{- define "mmfleet.fullname" -}}
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

{{/* Selector labels: stable for the life of a release (a Deployment's selector is immutable). */}}
{{- define "mmfleet.selectorLabels" -}}
app.kubernetes.io/name: {{ include "mmfleet.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{/* Labels on every object. Never mmfleet.io/inference: the operator watches objects that carry it. */}}
{{- define "mmfleet.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "mmfleet.selectorLabels" . }}
app.kubernetes.io/part-of: mmfleet
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* The ServiceAccount the operator runs as. */}}
{{- define "mmfleet.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "mmfleet.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The collector's selector labels, apart from the operator's (component otel-collector). */}}
{{- define "mmfleet.collectorSelectorLabels" -}}
app.kubernetes.io/name: {{ include "mmfleet.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: otel-collector
{{- end }}

{{/* Labels on the collector's objects. */}}
{{- define "mmfleet.collectorLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "mmfleet.collectorSelectorLabels" . }}
app.kubernetes.io/part-of: mmfleet
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* The collector's cloud: collector.cloud, else defaultCloud ("auto" when neither names one). */}}
{{- define "mmfleet.collectorCloud" -}}
{{- $cloud := .Values.collector.cloud | default .Values.defaultCloud }}
{{- if not (has $cloud (list "auto" "eks" "aks" "ack" "generic")) }}
{{- fail (printf "collector.cloud: %q: not one of eks, aks, ack, generic" $cloud) }}
{{- end }}
{{- $cloud }}
{{- end }}

{{/* "true" when the chart installs the collector: enabled, no endpoint to reuse, and a configuration to run
(collector.config, or a cloud's file; with defaultCloud auto and no collector.cloud there is none). */}}
{{- define "mmfleet.collectorInstalled" -}}
{{- $cloud := include "mmfleet.collectorCloud" . }}
{{- if and .Values.collector.enabled (not .Values.collector.endpoint) (or .Values.collector.config (ne $cloud "auto")) }}
{{- "true" }}
{{- end }}
{{- end }}

{{/* The fleets' default OTLP endpoint (the operator's MMFLEET_COLLECTOR_ENDPOINT): a reused collector's, else the
one this chart installs, or would once it knows the cloud, in the release namespace. */}}
{{- define "mmfleet.collectorEndpoint" -}}
{{- .Values.collector.endpoint | default (printf "http://mmfleet-otel-collector.%s.svc:4317" .Release.Namespace) }}
{{- end }}

{{/* Where the operator's own spans go: the endpoint of a reused collector, the installed one, or nowhere. */}}
{{- define "mmfleet.otlpEndpoint" -}}
{{- if .Values.collector.endpoint }}
{{- .Values.collector.endpoint }}
{{- else if include "mmfleet.collectorInstalled" . }}
{{- printf "http://mmfleet-otel-collector.%s.svc:4317" .Release.Namespace }}
{{- end }}
{{- end }}
