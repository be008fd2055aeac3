{{/*
Names, labels and the one place where the operator's RBAC rules and its arguments are defined.
*/}}

{{- define "lakeslot.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "lakeslot.fullname" -}}
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

{{- define "lakeslot.selectorLabels" -}}
app.kubernetes.io/name: {{ include "lakeslot.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{/* Labels of every object, without app.kubernetes.io/component. */}}
{{- define "lakeslot.commonLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "lakeslot.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Labels of the operator's objects. */}}
{{- define "lakeslot.labels" -}}
{{ include "lakeslot.commonLabels" . }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "lakeslot.serviceAccountName" -}}
{{- default (include "lakeslot.fullname" .) .Values.serviceAccount.name }}
{{- end }}

{{- define "lakeslot.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* Peering is on exactly when more than one replica runs. */}}
{{- define "lakeslot.peering" -}}
{{- if gt (int .Values.replicaCount) 1 }}true{{ end }}
{{- end }}

{{- define "lakeslot.peeringName" -}}
{{- default (include "lakeslot.fullname" .) .Values.peering.name }}
{{- end }}

{{/* Namespaces that get the Spark driver's service account and Role, as a JSON list. */}}
{{- define "lakeslot.sparkNamespaces" -}}
{{- default .Values.watchNamespaces .Values.spark.namespaces | toJson }}
{{- end }}

{{/* The names of imagePullSecrets, as a JSON list (the operator passes them to every pod). */}}
{{- define "lakeslot.pullSecretNames" -}}
{{- $names := list }}
{{- range .Values.imagePullSecrets }}{{ $names = append $names .name }}{{ end }}
{{- $names | toJson }}
{{- end }}

{{/*
The operator's command line: `lakeslot operator` with kopf's liveness endpoint, a --namespace per
watched namespace (none: all namespaces) and --peering when more than one replica runs.
*/}}
{{- define "lakeslot.operatorArgs" -}}
- operator
- --liveness
- http://0.0.0.0:{{ .Values.livenessPort }}/healthz
- --metrics-port
- {{ .Values.metrics.port | quote }}
{{- range .Values.watchNamespaces }}
- --namespace
- {{ . }}
{{- end }}
{{- if include "lakeslot.peering" . }}
- --peering
- {{ include "lakeslot.peeringName" . }}
{{- end }}
{{- end }}

{{/*
What the operator does inside the namespaces it serves, derived from its code (tests/test_rbac.py
compares these rules with the API calls in operator/lakeslot_operator/kube.py plus kopf's own):
- kopf: watch the PostgresIngestions, patch them (finalizer, progress annotations) and their
  status, post events;
- the children's ownerReferences (blockOwnerDeletion: true): update on postgresingestions/finalizers,
  which OwnerReferencesPermissionEnforcement (OpenShift) checks on every child create;
- lakeslot: read the Secrets an ingestion references (read only: it writes no Secret), list the
  reader pods (stale slot holders), manage the reader Deployments and the SparkApplications, run
  the verification Jobs (create one per request, read its state, delete one a newer request
  supersedes), and write each job's input document into a ConfigMap owned by the job (no
  credential in it). Every object is read before it is changed or deleted: lakeslot changes only
  its own (its labels and an owner reference).
*/}}
{{- define "lakeslot.namespacedRules" -}}
- apiGroups: [lakeslot.io]
  resources: [postgresingestions]
  verbs: [list, watch, patch]
- apiGroups: [lakeslot.io]
  resources: [postgresingestions/status]
  verbs: [patch]
- apiGroups: [lakeslot.io]
  resources: [postgresingestions/finalizers]
  verbs: [update]
- apiGroups: [""]
  resources: [events]
  verbs: [create]
- apiGroups: [""]
  resources: [secrets]
  verbs: [get]
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get, create, update]
- apiGroups: [""]
  resources: [pods]
  verbs: [list]
- apiGroups: [apps]
  resources: [deployments]
  verbs: [get, list, create, update, patch, delete]
- apiGroups: [sparkoperator.k8s.io]
  resources: [sparkapplications]
  verbs: [get, list, create, update, delete]
- apiGroups: [batch]
  resources: [jobs]
  verbs: [get, create, delete]
{{- end }}

{{/* kopf follows CRDs appearing and disappearing (cluster-scoped objects). */}}
{{- define "lakeslot.crdRules" -}}
- apiGroups: [apiextensions.k8s.io]
  resources: [customresourcedefinitions]
  verbs: [list, watch]
{{- end }}
