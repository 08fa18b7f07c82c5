{{- define "cozyplane-apiserver.labels" -}}
app.kubernetes.io/part-of: cozyplane
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "cozyplane-apiserver.image" -}}
{{- if not (regexMatch "^[^@:]+(:[0-9]+)?(/[^@:]+)*:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}@sha256:[0-9a-f]{64}$" .Values.image) -}}
{{- fail (printf "image must be repo:tag@sha256:<64 hex> (got %q); images/cozyplane/stamp writes it" .Values.image) -}}
{{- end -}}
{{- .Values.image -}}
{{- end -}}

{{- define "cozyplane-apiserver.storage" -}}
{{- if not (has .Values.storage.type (list "etcd" "embedded")) -}}
{{- fail (printf "storage.type must be etcd or embedded (got %q)" .Values.storage.type) -}}
{{- end -}}
{{- .Values.storage.type -}}
{{- end -}}
