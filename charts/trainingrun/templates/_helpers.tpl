{{/* Chart name, overridable. */}}
{{- define "trainingrun.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name of the objects: the release name, with the chart name unless it already holds it. */}}
{{- define "trainingrun.fullname" -}}
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

{{- define "trainingrun.selectorLabels" -}}
app.kubernetes.io/name: {{ include "trainingrun.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "trainingrun.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "trainingrun.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "trainingrun.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "trainingrun.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "trainingrun.peeringName" -}}
{{- default (include "trainingrun.fullname" .) .Values.peering.name }}
{{- end }}

{{/* repository:tag, or repository@digest when a digest is given. Argument: (list image chart). */}}
{{- define "trainingrun.imageRef" -}}
{{- $image := index . 0 }}
{{- $chart := index . 1 }}
{{- if $image.digest }}
{{- printf "%s@%s" $image.repository $image.digest }}
{{- else }}
{{- printf "%s:%s" $image.repository (default $chart.AppVersion $image.tag) }}
{{- end }}
{{- end }}
