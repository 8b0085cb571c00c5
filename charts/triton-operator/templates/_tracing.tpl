{{/* The gateway's OpenTelemetry settings (tracing.*), as the standard OTEL_* variables. */}}
{{- define "triton-operator.tracingEnv" -}}
{{- if .Values.tracing.enabled }}
- {name: OTEL_EXPORTER_OTLP_ENDPOINT, value: {{ .Values.tracing.endpoint | quote }}}
- {name: OTEL_EXPORTER_OTLP_PROTOCOL, value: http/protobuf}
- {name: OTEL_SERVICE_NAME, value: {{ .Values.tracing.serviceName | quote }}}
- {name: OTEL_TRACES_SAMPLER, value: {{ .Values.tracing.sampler | quote }}}
{{- with .Values.tracing.samplerArg }}
- {name: OTEL_TRACES_SAMPLER_ARG, value: {{ . | quote }}}
{{- end }}
- name: OTEL_K8S_POD_NAME
  valueFrom: {fieldRef: {fieldPath: metadata.name}}
- name: OTEL_RESOURCE_ATTRIBUTES
  value: {{ printf "k8s.namespace.name=%s,k8s.pod.name=$(OTEL_K8S_POD_NAME)" .Release.Namespace | quote }}
{{- end }}
{{- end -}}
