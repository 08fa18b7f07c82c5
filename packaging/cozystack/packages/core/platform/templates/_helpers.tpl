{{- /*
Excerpt of packages/core/platform/templates/_helpers.tpl: the Package helpers
the bundles call (same arguments and output as Cozystack's), the new
networking-variant helper, and common-packages with its CNI-coupled entries
gated on that variant.
*/ -}}

{{- /*
A Package for a PackageSource of the same name:
(list <name> <variant> $ [<components dict>]). Emits nothing when the name is
in bundles.disabledPackages. helm.sh/resource-policy: keep leaves a Package on
the cluster once the platform stops emitting it (the operator deletes it by
hand or lists it in disabledPackages).
*/ -}}
{{- define "cozystack.platform.package" -}}
{{- $name := index . 0 -}}
{{- $variant := index . 1 | default "default" -}}
{{- $root := index . 2 -}}
{{- $components := dict -}}
{{- if gt (len .) 3 -}}
{{- $components = index . 3 -}}
{{- end -}}
{{- if not (has $name ($root.Values.bundles.disabledPackages | default list)) -}}
---
apiVersion: cozystack.io/v1alpha1
kind: Package
metadata:
  name: {{ $name }}
  annotations:
    helm.sh/resource-policy: keep
spec:
  variant: {{ $variant }}
{{- with $components }}
  components:
{{ toYaml . | indent 4 }}
{{- end }}
{{- end }}
{{ end }}

{{- /* (list <name> $): the Package with variant default and no values. */ -}}
{{- define "cozystack.platform.package.default" -}}
{{- include "cozystack.platform.package" (list (index . 0) "default" (index . 1)) }}
{{ end }}

{{- /*
The networking variant of the system bundle, validated: the string
"kubeovn-cilium" (the default, also when the key is unset or empty) or
"cozyplane". Everything that differs per CNI asks this helper, so a value that
is not one of the two fails the render here, on the first render after the
values change, instead of silently selecting a half of each stack.

cozyplane is refused where it cannot work:
- outside bundles.system.variant isp-full: its PackageSource variant installs
  the Talos values (KubePrism on localhost:7445), and isp-hosted has no CNI to
  replace;
- with networking.encryption.enabled: cozyplane does not encrypt east-west
  traffic, and an operator who asked for encryption must not get a cluster
  that silently sends it in the clear.
*/ -}}
{{- define "cozystack.platform.networkingVariant" -}}
{{- $bundles := .Values.bundles | default dict -}}
{{- $variant := dig "system" "networkingVariant" "" $bundles | toString | default "kubeovn-cilium" -}}
{{- if not (has $variant (list "kubeovn-cilium" "cozyplane")) -}}
{{- fail (printf "bundles.system.networkingVariant must be \"kubeovn-cilium\" (the default) or \"cozyplane\", got %q" $variant) -}}
{{- end -}}
{{- if eq $variant "cozyplane" -}}
{{- $systemVariant := dig "system" "variant" "" $bundles | toString -}}
{{- if ne $systemVariant "isp-full" -}}
{{- fail (printf "bundles.system.networkingVariant \"cozyplane\" needs bundles.system.variant \"isp-full\" (its package installs the Talos values), got %q" $systemVariant) -}}
{{- end -}}
{{- if dig "encryption" "enabled" false (.Values.networking | default dict) -}}
{{- fail "networking.encryption.enabled is not supported with bundles.system.networkingVariant \"cozyplane\": cozyplane does not encrypt east-west traffic. Turn encryption off, or keep networkingVariant \"kubeovn-cilium\" (KubeOVN IPsec)." -}}
{{- end -}}
{{- end -}}
{{- $variant -}}
{{- end }}

{{- /*
System packages shared by isp-full and isp-full-generic (each branch emits
networking, multus, linstor and the scheduler itself). kubeovn-webhook,
kubeovn-plunger and securitygroup-controller serve KubeOVN and Cilium
(securitygroup-controller labels pods for CiliumNetworkPolicy-backed
SecurityGroups): with cozyplane there is neither, so they are not emitted.
*/ -}}
{{- define "cozystack.platform.system.common-packages" -}}
{{- $root := . -}}
{{- $kubeovnCilium := eq (include "cozystack.platform.networkingVariant" $root) "kubeovn-cilium" -}}
{{- if $kubeovnCilium }}
{{include "cozystack.platform.package.default" (list "cozystack.kubeovn-webhook" $root) }}
{{include "cozystack.platform.package.default" (list "cozystack.kubeovn-plunger" $root) }}
{{- end }}
{{include "cozystack.platform.package.default" (list "cozystack.cozy-proxy" $root) }}
{{include "cozystack.platform.package.default" (list "cozystack.metallb" $root) }}
{{include "cozystack.platform.package.default" (list "cozystack.reloader" $root) }}
{{include "cozystack.platform.package.default" (list "cozystack.linstor-scheduler" $root) }}
{{include "cozystack.platform.package.default" (list "cozystack.snapshot-controller" $root) }}
{{- if $kubeovnCilium }}
{{include "cozystack.platform.package.default" (list "cozystack.securitygroup-controller" $root) }}
{{- end }}
{{- end }}
