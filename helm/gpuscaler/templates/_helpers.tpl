{{/*
Expand the name of the chart.
*/}}
{{- define "gpuscaler.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Create a default fully qualified app name (63 characters at most: some Kubernetes name fields are
limited to this by the DNS naming spec). If the release name contains the chart name it is used as
the full name.
*/}}
{{- define "gpuscaler.fullname" -}}
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

{{/*
Chart name and version as used by the chart label.
*/}}
{{- define "gpuscaler.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Common labels
*/}}
{{- define "gpuscaler.labels" -}}
helm.sh/chart: {{ include "gpuscaler.chart" . }}
{{ include "gpuscaler.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: gpuscaler
{{- end }}

{{/*
Selector labels
*/}}
{{- define "gpuscaler.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpuscaler.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
Create the name of the service account to use
*/}}
{{- define "gpuscaler.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "gpuscaler.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
The image reference; the tag defaults to the chart's appVersion.
*/}}
{{- define "gpuscaler.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/*
The namespace the operator watches: settings.namespace, else the release namespace in namespaced
mode; empty (all namespaces) otherwise.
*/}}
{{- define "gpuscaler.watchNamespace" -}}
{{- if .Values.settings.namespace }}
{{- .Values.settings.namespace }}
{{- else if .Values.rbac.namespaced }}
{{- .Release.Namespace }}
{{- end }}
{{- end }}

{{/*
The worker admission policy's name, and its binding's: the policy's, with -<namespace> in
namespaced mode (gpuscaler.kube.admission binding_name: each watched namespace keeps its own).
*/}}
{{- define "gpuscaler.workerPolicy" -}}{{ include "gpuscaler.fullname" . }}-worker-own-pod{{- end }}
{{- define "gpuscaler.workerPolicyBinding" -}}
{{- $ns := include "gpuscaler.watchNamespace" . }}
{{- if $ns }}{{ include "gpuscaler.workerPolicy" . }}-{{ $ns }}{{ else }}{{ include "gpuscaler.workerPolicy" . }}{{ end }}
{{- end }}

{{/*
The finalizer policy's name (templates/finalizer-policy.yaml), and its binding's: the policy's,
with -<namespace> where the operator watches one namespace.
*/}}
{{- define "gpuscaler.finalizerPolicy" -}}{{ include "gpuscaler.fullname" . }}-finalizer{{- end }}
{{- define "gpuscaler.finalizerPolicyBinding" -}}
{{- $ns := include "gpuscaler.watchNamespace" . }}
{{- if $ns }}{{ include "gpuscaler.finalizerPolicy" . }}-{{ $ns }}{{ else }}{{ include "gpuscaler.finalizerPolicy" . }}{{ end }}
{{- end }}

{{/*
Where the policies ConfigMap is mounted, and the file the operator reads.
*/}}
{{- define "gpuscaler.policyDir" -}}/etc/gpuscaler/policies{{- end }}
{{- define "gpuscaler.policyFile" -}}{{ include "gpuscaler.policyDir" . }}/policies.yaml{{- end }}

{{/*
The effective settings: values' settings plus what the chart decides (policyFile, namespace, and
workerAdmissionPolicyName: the name of templates/worker-admission-policy.yaml's objects).
Rendered as JSON, read back with fromJson.
*/}}
{{- define "gpuscaler.settings" -}}
{{- $s := deepCopy .Values.settings }}
{{- if .Values.policies }}
{{- $_ := set $s "policyFile" (include "gpuscaler.policyFile" .) }}
{{- end }}
{{- $ns := include "gpuscaler.watchNamespace" . }}
{{- if $ns }}
{{- $_ := set $s "namespace" $ns }}
{{- end }}
{{- $_ := set $s "workerAdmissionPolicyName" (include "gpuscaler.workerPolicy" .) }}
{{- if and .Values.settings.pricesProviders (not .Values.settings.pricesNamespace) }}
{{- $_ := set $s "pricesNamespace" .Release.Namespace }}
{{- end }}
{{- toJson $s }}
{{- end }}

{{/*
Settings as environment variables: camelCase key -> GPUSCALER_<UPPER_SNAKE>; null keys are left
out (the operator's default applies); lists and maps are passed as JSON (pydantic-settings parses
it); whole numbers are written without an exponent (Helm reads every number as a float).
*/}}
{{- define "gpuscaler.settingsEnv" -}}
{{- $s := include "gpuscaler.settings" . | fromJson }}
{{- range $key := keys $s | sortAlpha }}
{{- $value := get $s $key }}
{{- if not (kindIs "invalid" $value) }}
- name: GPUSCALER_{{ $key | snakecase | upper }}
  {{- if or (kindIs "map" $value) (kindIs "slice" $value) }}
  value: {{ toJson $value | quote }}
  {{- else if and (kindIs "float64" $value) (eq $value (float64 (int64 $value))) }}
  value: {{ int64 $value | toString | quote }}
  {{- else }}
  value: {{ $value | toString | quote }}
  {{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/*
RBAC rules of the batch integrations, on the namespaced objects of the watched namespaces (a
ClusterRole in cluster mode, the Role in namespaced mode). docs/kueue-jobset.md lists them.
*/}}
{{- define "gpuscaler.batchRules" -}}
{{- if .Values.kueue.enabled }}
# Application (kueue.enabled): the gang's Kueue Workload is read for admission, the assigned
# flavor and why it waits or was evicted; LocalQueues are read to say a named queue is missing.
- apiGroups: [kueue.x-k8s.io]
  resources: [workloads, localqueues]
  verbs: [get, list, watch]
{{- end }}
{{- if .Values.jobset.enabled }}
# Application (jobset.enabled): the gang of a runtime: jobset job is one JobSet, created, read
# and deleted (re-created with the new shape after a re-plan; deleted with the job).
- apiGroups: [jobset.x-k8s.io]
  resources: [jobsets]
  verbs: [get, list, watch, create, delete]
{{- end }}
{{- end }}

{{/*
RBAC rules of the Kueue integration on cluster-scoped objects (always in the ClusterRole).
*/}}
{{- define "gpuscaler.kueueClusterRules" -}}
{{- if .Values.kueue.enabled }}
# Application (kueue.enabled): ResourceFlavors are read to name the flavor matching the plan's
# GPU type and capacity type (their node labels), ClusterQueues to report quota in the reason.
- apiGroups: [kueue.x-k8s.io]
  resources: [resourceflavors, clusterqueues]
  verbs: [get, list, watch]
{{- end }}
{{- end }}
