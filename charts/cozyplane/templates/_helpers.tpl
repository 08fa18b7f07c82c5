{{/* Labels every object of the chart carries. */}}
{{- define "cozyplane.labels" -}}
app.kubernetes.io/part-of: cozyplane
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The image, refused unless it is repo:tag@sha256:digest (Cozystack's rule: both halves). */}}
{{- define "cozyplane.image" -}}
{{- if not (regexMatch "^[^@:]+(:[0-9]+)?(/[^@:]+)*:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}@sha256:[0-9a-f]{64}$" .Values.image) -}}
{{- fail (printf "image must be repo:tag@sha256:<64 hex> (got %q); images/cozyplane/stamp writes it" .Values.image) -}}
{{- end -}}
{{- .Values.image -}}
{{- end -}}

{{/* The restricted container security context (no privilege at all). */}}
{{- define "cozyplane.restricted" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
capabilities:
  drop: [ALL]
seccompProfile:
  type: RuntimeDefault
{{- end -}}
