{{/* Chart name. */}}
{{- define "triton-operator.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Full name: the release name, with the chart name unless the release already holds it. */}}
{{- define "triton-operator.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "triton-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "triton-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "triton-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "triton-operator.labels" -}}
helm.sh/chart: {{ include "triton-operator.chart" . }}
{{ include "triton-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "triton-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "triton-operator.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The node labels each catalog class matches per gpuClassLabels preset: GKE's accelerator
values (GKE docs, AI-Hypercomputer/xpk system_characteristics) and EKS's instance types. */}}
{{- define "triton-operator.gpuClassPresets" -}}
gke:
  label: cloud.google.com/gke-accelerator
  values:
    h100: [nvidia-h100-80gb, nvidia-h100-mega-80gb]
    h200: [nvidia-h200-141gb]
    a100-80gb: [nvidia-a100-80gb]
    l4: [nvidia-l4]
    b200: [nvidia-b200]
    gb200: [nvidia-gb200]
eks:
  label: node.kubernetes.io/instance-type
  values:
    h100: [p5.48xlarge, p5.4xlarge]
    h200: [p5e.48xlarge, p5en.48xlarge]
    a100-80gb: [p4de.24xlarge]
    l4: [g6.xlarge, g6.2xlarge, g6.4xlarge, g6.8xlarge, g6.12xlarge, g6.16xlarge, g6.24xlarge, g6.48xlarge]
    b200: [p6-b200.48xlarge]
{{- end -}}

{{/* The enabled GPUClasses as a YAML stream, with the gpuClassLabels preset's node labels. */}}
{{- define "triton-operator.catalog" -}}
{{- $presets := include "triton-operator.gpuClassPresets" . | fromYaml -}}
{{- $preset := get $presets .Values.gpuClassLabels -}}
{{- range $name, $class := .Values.gpuClasses }}
{{- if $class.enabled }}
{{- $spec := omit $class "enabled" }}
{{- if and $preset (not (hasKey $class "productLabel")) (hasKey $preset.values $name) }}
{{- $spec = merge (dict "productLabel" $preset.label "productNames" (get $preset.values $name)) (omit $spec "productNames") }}
{{- end }}
---
apiVersion: serving.triton-operator.io/v1alpha1
kind: GPUClass
metadata:
  name: {{ $name }}
spec:
  {{- toYaml $spec | nindent 2 }}
{{- end }}
{{- end }}
{{- end -}}

{{/* RBAC rules for the namespaced objects the operator manages (see rbac.yaml). */}}
{{- define "triton-operator.namespacedRules" }}
- apiGroups: [serving.triton-operator.io]
  resources: [inferenceservices]
  # get: an owner is read afresh before a child of its is created (the cache may lag its deletion)
  verbs: [get, list, watch, patch]
- apiGroups: [serving.triton-operator.io]
  resources: [inferenceservices/status]
  verbs: [patch]
- apiGroups: [serving.triton-operator.io]
  resources: [inferenceservices/finalizers]
  verbs: [update]
- apiGroups: [apps]
  resources: [deployments]
  verbs: [list, watch, create, patch, delete]
- apiGroups: [""]
  resources: [services]
  verbs: [list, watch, create, patch]
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [list, watch, create, patch]
- apiGroups: [batch]
  resources: [jobs]
  verbs: [list, watch, create, patch, delete]
{{- if .Values.networkPolicy.enabled }}
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [list, watch, create, patch]
{{- end }}
# Replicas across nodes: LeaderWorkerSet groups (where the cluster has LWS installed), and the SSH
# key pair their MPI launch uses: created once, never read back, deleted with the service.
- apiGroups: [leaderworkerset.x-k8s.io]
  resources: [leaderworkersets]
  verbs: [list, watch, create, patch, delete]
- apiGroups: [""]
  resources: [secrets]
  verbs: [create]
# spec.routing.inferencePool: an InferencePool for a gateway of the Gateway API Inference Extension
# (where its CRDs are installed); deleted when the field is taken out.
- apiGroups: [inference.networking.k8s.io]
  resources: [inferencepools]
  verbs: [list, watch, create, patch, delete]
- apiGroups: [""]
  resources: [pods]
  verbs: [list, watch]
- apiGroups: [""]
  resources: [events]
  verbs: [create, patch]
{{- end }}

{{/* The operator's NetworkPolicy setting (JSON): who may reach the Triton pods it runs. */}}
{{- define "triton-operator.networkPolicy" -}}
{{- $clients := list -}}
{{- if .Values.gateway.enabled -}}
{{- $gateway := dict "namespaceSelector" (dict "matchLabels" (dict "kubernetes.io/metadata.name" .Release.Namespace)) "podSelector" (dict "matchLabels" (include "triton-operator.gateway.selectorLabels" . | fromYaml)) -}}
{{- $clients = append $clients $gateway -}}
{{- end -}}
{{- $clients = concat $clients .Values.networkPolicy.tritonClients -}}
{{- /* an empty list concatenated is nil, which toJson writes as null: the operator refused it and exited */ -}}
{{- if not $clients -}}{{- $clients = fromJsonArray "[]" -}}{{- end -}}
{{- dict "enabled" .Values.networkPolicy.enabled "clients" $clients "metrics" .Values.networkPolicy.prometheus | toJson -}}
{{- end -}}

{{- define "triton-operator.gateway.fullname" -}}
{{- printf "%s-gateway" (include "triton-operator.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "triton-operator.gateway.selectorLabels" -}}
app.kubernetes.io/name: {{ include "triton-operator.name" . }}-gateway
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "triton-operator.gateway.labels" -}}
helm.sh/chart: {{ include "triton-operator.chart" . }}
{{ include "triton-operator.gateway.selectorLabels" . }}
app.kubernetes.io/component: gateway
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* Namespaces the gateway serves: its own list, else the operator's. */}}
{{- define "triton-operator.gateway.namespaces" -}}
{{- join "," (default .Values.watchNamespaces .Values.gateway.namespaces) -}}
{{- end -}}

{{/* The URL users reach the gateway at. */}}
{{- define "triton-operator.gateway.url" -}}
{{- if .Values.gateway.url -}}
{{- .Values.gateway.url -}}
{{- else -}}
{{- printf "http://%s.%s.svc.%s:%v" (include "triton-operator.gateway.fullname" .) .Release.Namespace .Values.clusterDomain .Values.gateway.service.port -}}
{{- end -}}
{{- end -}}

{{/* RBAC rules of the gateway: read InferenceServices and EndpointSlices through watches. */}}
{{- define "triton-operator.gateway.rules" }}
- apiGroups: [serving.triton-operator.io]
  resources: [inferenceservices]
  verbs: [list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [list, watch]
{{- end }}
