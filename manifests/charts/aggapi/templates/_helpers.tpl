{{/* ---- names ------------------------------------------------------------------ */}}

{{- define "aggapi.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* "aggapi" for a release named aggapi; <release>-aggapi otherwise (unless overridden). */}}
{{- define "aggapi.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "aggapi.agentName" -}}
{{- printf "%s-agent" (include "aggapi.fullname" .) -}}
{{- end -}}

{{- define "aggapi.apiserverSA" -}}
{{- default (printf "%s-apiserver" (include "aggapi.fullname" .)) .Values.serviceAccount.apiserver.name -}}
{{- end -}}

{{- define "aggapi.agentSA" -}}
{{- default (include "aggapi.agentName" .) .Values.serviceAccount.agent.name -}}
{{- end -}}

{{- define "aggapi.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* Secret and ConfigMap names, per TLS mode. */}}
{{- define "aggapi.secret.apiserver" -}}
{{- if eq .Values.tls.mode "existingSecret" -}}{{ .Values.tls.existingSecret.apiserver }}{{- else -}}{{ include "aggapi.fullname" . }}-apiserver-tls{{- end -}}
{{- end -}}
{{- define "aggapi.secret.agent" -}}
{{- if eq .Values.tls.mode "existingSecret" -}}{{ .Values.tls.existingSecret.agent }}{{- else -}}{{ include "aggapi.fullname" . }}-agent-tls{{- end -}}
{{- end -}}
{{- define "aggapi.secret.agentClient" -}}
{{- if eq .Values.tls.mode "existingSecret" -}}{{ .Values.tls.existingSecret.agentClient }}{{- else -}}{{ include "aggapi.fullname" . }}-agent-client-tls{{- end -}}
{{- end -}}
{{- define "aggapi.secret.tokenSigning" -}}
{{- if eq .Values.tokenSigning.mode "existingSecret" -}}{{ .Values.tokenSigning.existingSecret }}{{- else -}}{{ include "aggapi.fullname" . }}-token-signing{{- end -}}
{{- end -}}
{{- define "aggapi.configmap.tokenPublic" -}}
{{- if eq .Values.tokenSigning.mode "existingSecret" -}}{{ .Values.tokenSigning.existingPublicConfigMap }}{{- else -}}{{ include "aggapi.fullname" . }}-token-public{{- end -}}
{{- end -}}

{{/* ---- labels ----------------------------------------------------------------- */}}

{{- define "aggapi.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "aggapi.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: aggapi
{{- end -}}

{{- define "aggapi.selectorLabels.apiserver" -}}
app.kubernetes.io/name: {{ include "aggapi.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: apiserver
{{- end -}}

{{- define "aggapi.selectorLabels.agent" -}}
app.kubernetes.io/name: {{ include "aggapi.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: agent
{{- end -}}

{{/* ---- DNS names ---------------------------------------------------------------- */}}

{{- define "aggapi.dnsNames" -}}
{{- $ns := .ns -}}
{{- list .svc (printf "%s.%s" .svc $ns) (printf "%s.%s.svc" .svc $ns) (printf "%s.%s.svc.cluster.local" .svc $ns) | toJson -}}
{{- end -}}

{{/* ---- generated PKI (tls.mode=helm, tokenSigning.mode=helm) ---------------------

Computed once per render and memoised in .Values, so every template (the Secrets, the
APIService caBundle, the checksum annotations) sees the same CA. On upgrade the existing
Secrets are read back with lookup and reused as they are; if any of the three TLS
Secrets is missing or incomplete, all three are issued again from a new CA.
`helm template` and client-side dry runs cannot look up, so they always show fresh keys.
Result (JSON): ca, apiserverCrt, apiserverKey, agentCrt, agentKey, agentClientCrt,
agentClientKey, tokenKey, tokenCrt (PEM strings; absent when the mode is not helm). */}}
{{- define "aggapi.pki" -}}
{{- if not (hasKey .Values "aggapiGeneratedPKI") -}}
{{- $ns := .Release.Namespace -}}
{{- $out := dict -}}
{{- if not .Values.tls.helm.lookup -}}
{{- /* Without lookup every render would mint new keys (a GitOps sync loop that also
breaks the running pods' trust): refuse, and say what works instead. */ -}}
{{- if or (eq .Values.tls.mode "helm") (eq .Values.tokenSigning.mode "helm") -}}
{{- fail "tls.helm.lookup=false: the chart cannot keep keys it generates without lookup, so tls.mode=helm and tokenSigning.mode=helm would change on every render. Use tls.mode=certManager (tokenSigning.mode=ephemeral, the default, or existingSecret), or tls.mode=existingSecret with Secrets made once (aggapi certs) and tls.existingSecret.caBundle; see the chart README." -}}
{{- end -}}
{{- if and (eq .Values.tls.mode "existingSecret") (not .Values.tls.existingSecret.caBundle) -}}
{{- fail "tls.helm.lookup=false with tls.mode=existingSecret: set tls.existingSecret.caBundle (the CA PEM), the chart cannot read it from the Secret without lookup." -}}
{{- end -}}
{{- end -}}
{{- if eq .Values.tls.mode "helm" -}}
  {{- $names := list (include "aggapi.secret.apiserver" .) (include "aggapi.secret.agent" .) (include "aggapi.secret.agentClient" .) -}}
  {{- $found := list -}}
  {{- range $names -}}
    {{- $s := lookup "v1" "Secret" $ns . -}}
    {{- $d := dig "data" dict $s -}}
    {{- if and (hasKey $d "tls.crt") (hasKey $d "tls.key") (hasKey $d "ca.crt") -}}
      {{- $found = append $found $d -}}
    {{- end -}}
  {{- end -}}
  {{- if eq (len $found) 3 -}}
    {{- $a := index $found 0 -}}{{- $g := index $found 1 -}}{{- $c := index $found 2 -}}
    {{- $_ := set $out "ca" (index $a "ca.crt" | b64dec) -}}
    {{- $_ := set $out "apiserverCrt" (index $a "tls.crt" | b64dec) -}}
    {{- $_ := set $out "apiserverKey" (index $a "tls.key" | b64dec) -}}
    {{- $_ := set $out "agentCrt" (index $g "tls.crt" | b64dec) -}}
    {{- $_ := set $out "agentKey" (index $g "tls.key" | b64dec) -}}
    {{- $_ := set $out "agentClientCrt" (index $c "tls.crt" | b64dec) -}}
    {{- $_ := set $out "agentClientKey" (index $c "tls.key" | b64dec) -}}
  {{- else -}}
    {{- $days := int .Values.tls.helm.validityDays -}}
    {{- $full := include "aggapi.fullname" . -}}
    {{- $ca := genCA (printf "%s-ca" $full) $days -}}
    {{- $apiDNS := include "aggapi.dnsNames" (dict "svc" $full "ns" $ns) | fromJsonArray -}}
    {{- $agentDNS := include "aggapi.dnsNames" (dict "svc" (include "aggapi.agentName" .) "ns" $ns) | fromJsonArray -}}
    {{- $api := genSignedCert $full nil $apiDNS $days $ca -}}
    {{- $agent := genSignedCert "aggapi-agent" nil $agentDNS $days $ca -}}
    {{- $client := genSignedCert "aggapi-apiserver" nil nil $days $ca -}}
    {{- $_ := set $out "ca" $ca.Cert -}}
    {{- $_ := set $out "apiserverCrt" $api.Cert -}}
    {{- $_ := set $out "apiserverKey" $api.Key -}}
    {{- $_ := set $out "agentCrt" $agent.Cert -}}
    {{- $_ := set $out "agentKey" $agent.Key -}}
    {{- $_ := set $out "agentClientCrt" $client.Cert -}}
    {{- $_ := set $out "agentClientKey" $client.Key -}}
  {{- end -}}
{{- end -}}
{{- if eq .Values.tokenSigning.mode "helm" -}}
  {{- $s := lookup "v1" "Secret" $ns (include "aggapi.secret.tokenSigning" .) -}}
  {{- $d := dig "data" dict $s -}}
  {{- if and (hasKey $d "tls.key") (hasKey $d "tls.crt") -}}
    {{- $_ := set $out "tokenKey" (index $d "tls.key" | b64dec) -}}
    {{- $_ := set $out "tokenCrt" (index $d "tls.crt" | b64dec) -}}
  {{- else -}}
    {{- $key := genPrivateKey "ecdsa" -}}
    {{- $crt := genSelfSignedCertWithKey "aggapi-token-signing" nil nil (int .Values.tokenSigning.validityDays) $key -}}
    {{- $_ := set $out "tokenKey" $key -}}
    {{- $_ := set $out "tokenCrt" $crt.Cert -}}
  {{- end -}}
{{- end -}}
{{- $_ := set .Values "aggapiGeneratedPKI" $out -}}
{{- end -}}
{{- toJson (get .Values "aggapiGeneratedPKI") -}}
{{- end -}}

{{/* The APIService caBundle (base64), or "" when cert-manager injects it. */}}
{{- define "aggapi.caBundle" -}}
{{- if eq .Values.tls.mode "helm" -}}
{{- (include "aggapi.pki" . | fromJson).ca | b64enc -}}
{{- else if eq .Values.tls.mode "existingSecret" -}}
{{- if .Values.tls.existingSecret.caBundle -}}
{{- .Values.tls.existingSecret.caBundle | b64enc -}}
{{- else -}}
{{- $s := lookup "v1" "Secret" .Release.Namespace .Values.tls.existingSecret.apiserver -}}
{{- dig "data" "ca.crt" "" $s -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* ---- pod fields shared by the apiserver and the agent ------------------------- */}}

{{/* Pod labels: the selector labels (.sel, YAML) win over .extra (podLabels). */}}
{{- define "aggapi.podLabels" -}}
{{- toYaml (merge (.sel | fromYaml) (deepCopy (.extra | default dict))) -}}
{{- end -}}

{{/* Scheduling, identity and network fields of a pod spec. .v: the component's values;
.affinity: the affinity to render; .sel: its selector labels (YAML), given to topology
spread constraints that name no labelSelector. */}}
{{- define "aggapi.podScheduling" -}}
{{- with .v.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- if .v.hostNetwork }}
hostNetwork: true
# Keeps cluster DNS for the pod while it uses the node's network.
dnsPolicy: ClusterFirstWithHostNet
{{- end }}
{{- with .v.podSecurityContext }}
securityContext:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .v.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .v.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- $sel := .sel | fromYaml }}
{{- $spread := list }}
{{- range .v.topologySpreadConstraints }}
{{- $c := deepCopy . }}
{{- if not (hasKey $c "labelSelector") }}
{{- $_ := set $c "labelSelector" (dict "matchLabels" $sel) }}
{{- end }}
{{- $spread = append $spread $c }}
{{- end }}
{{- with $spread }}
topologySpreadConstraints:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* apiserver.antiAffinity: replicas on different nodes, preferred (soft) or required. */}}
{{- define "aggapi.apiserverAntiAffinity" -}}
{{- $term := dict "topologyKey" "kubernetes.io/hostname" "labelSelector" (dict "matchLabels" (include "aggapi.selectorLabels.apiserver" . | fromYaml)) -}}
{{- if eq .Values.apiserver.antiAffinity "hard" -}}
requiredDuringSchedulingIgnoredDuringExecution:
  {{- toYaml (list $term) | nindent 2 }}
{{- else -}}
preferredDuringSchedulingIgnoredDuringExecution:
  {{- toYaml (list (dict "weight" 100 "podAffinityTerm" $term)) | nindent 2 }}
{{- end -}}
{{- end -}}

{{/* ---- process flags (one place, so renames are one edit) ------------------------- */}}

{{/* The name of the agent's HTTPS port: the agent Service's port (hence the port name in
its EndpointSlices, which the apiserver looks up with --agent-port-name) and the
container port it targets. */}}
{{- define "aggapi.agentPortName" -}}https{{- end -}}

{{- define "aggapi.apiserverArgs" -}}
- apiserver
- --bind-address=0.0.0.0
- --secure-port={{ .Values.apiserver.port }}
- --tls-cert-file=/etc/aggapi/serving/tls.crt
- --tls-private-key-file=/etc/aggapi/serving/tls.key
- --agent-service={{ include "aggapi.agentName" . }}
- --agent-namespace={{ .Release.Namespace }}
- --agent-port-name={{ include "aggapi.agentPortName" . }}
{{- if eq .Values.agent.servingIdentity "ephemeral" }}
- --agent-identity-key-set={{ include "aggapi.fullname" . }}
- --agent-service-account={{ include "aggapi.agentSA" . }}
{{- end }}
- --agent-ca-file=/etc/aggapi/agent-client/ca.crt
- --agent-client-cert-file=/etc/aggapi/agent-client/tls.crt
- --agent-client-key-file=/etc/aggapi/agent-client/tls.key
- --pod-namespace=$(POD_NAMESPACE)
- --pod-name=$(POD_NAME)
- --leader-elect=true
- --leader-elect-lease={{ include "aggapi.fullname" . }}-collections
- --advertise-address=$(POD_IP)
{{- if eq .Values.tokenSigning.mode "ephemeral" }}
- --token-key-set={{ include "aggapi.fullname" . }}
- --pod-uid=$(POD_UID)
{{- else }}
- --token-signing-key-file=/etc/aggapi/token-signing/tls.key
{{- end }}
- --authz-allow-ttl={{ .Values.apiserver.sarCacheTTL }}
- --authz-deny-ttl={{ .Values.apiserver.sarCacheTTL }}
- --shutdown-grace={{ .Values.apiserver.shutdownGracePeriod }}
- --shutdown-delay={{ .Values.apiserver.shutdownDelaySeconds }}
{{- if gt (int .Values.apiserver.handoverTimeoutSeconds) (add (int .Values.apiserver.shutdownDelaySeconds) (int .Values.apiserver.shutdownGracePeriod)) }}
{{- fail "apiserver.handoverTimeoutSeconds may be at most apiserver.shutdownDelaySeconds + apiserver.shutdownGracePeriod: the hand-over's time past the delay comes off the grace, and the pod's terminationGracePeriodSeconds is their sum (+15)." }}
{{- end }}
- --handover-timeout={{ .Values.apiserver.handoverTimeoutSeconds }}
- --copy-require-exec={{ .Values.apiserver.copyRequireExec }}
- --always-allow-metrics={{ .Values.apiserver.metricsAlwaysAllow }}
- --fleet-metrics={{ .Values.apiserver.fleetMetrics }}
- --collection-warm={{ .Values.apiserver.collectionWarm }}
- --link-peers={{ .Values.apiserver.linkPeers }}
- --read-header-timeout={{ .Values.apiserver.readHeaderTimeout }}
- --log-level={{ .Values.apiserver.logLevel }}
{{- range .Values.apiserver.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end -}}

{{- define "aggapi.agentArgs" -}}
- agent
- --bind-address=0.0.0.0
- --secure-port={{ .Values.agent.port }}
- --node-name=$(NODE_NAME)
{{- if eq .Values.agent.servingIdentity "ephemeral" }}
- --identity-key-set={{ include "aggapi.fullname" . }}
{{- else }}
- --tls-cert-file=/etc/aggapi/agent/tls.crt
- --tls-private-key-file=/etc/aggapi/agent/tls.key
{{- end }}
- --client-ca-file=/etc/aggapi/agent/ca.crt
{{- range .Values.agent.allowedClientCNs }}
- --allowed-client-cn={{ . }}
{{- end }}
{{- if eq .Values.tokenSigning.mode "ephemeral" }}
- --token-key-set={{ include "aggapi.fullname" . }}
- --token-key-namespace={{ .Release.Namespace }}
{{- else }}
- --token-public-key-file=/etc/aggapi/token-public/token-public.pem
{{- end }}
- --cri-address={{ .Values.agent.criSocketDir }}/{{ .Values.agent.criSocketName }}
- --containerd-address={{ .Values.agent.criSocketDir }}/{{ .Values.agent.criSocketName }}
{{- /* Through the host's root as PID 1 sees it (hostPID), not a hostPath mount: a
missing file is no mount error (the agent falls back to kubelet defaults and says why),
and a file replaced by rename is read anew, which a single-file bind mount never shows.
Mounting the parent instead would copy /var/lib/kubelet's pod volume mounts into the
agent. Empty: no flag; the image holds no kubelet config, so kubelet defaults. */}}
{{- with .Values.agent.kubeletConfig }}
- --kubelet-config=/proc/1/root{{ . }}
{{- end }}
- --copy-size-limit={{ .Values.agent.copySizeLimit }}
- --copies-per-pod={{ .Values.agent.copiesPerPod }}
- --copies-per-node={{ .Values.agent.copiesPerNode }}
- --copy-namespace-share={{ .Values.agent.copyNamespaceShare }}
- --copy-min-rate={{ .Values.agent.copyMinRate }}
- --copy-rate-window={{ .Values.agent.copyRateWindow }}
- --copy-state-dir={{ .Values.agent.copyStateDir }}
- --copy-direct-io-min-size={{ .Values.agent.copyDirectIOMinSize }}
- --drain-timeout={{ .Values.agent.drainSeconds }}
{{- if .Values.agent.copyAsRoot }}
- --copy-as-root
{{- end }}
- --read-header-timeout={{ .Values.agent.readHeaderTimeout }}
- --body-idle-timeout={{ .Values.agent.bodyIdleTimeout }}
- --health-port={{ .Values.agent.healthPort }}
- --metrics-port={{ .Values.agent.metrics.port }}
- --metrics-auth=delegated
- --pull-stall-seconds={{ .Values.agent.metrics.pullStallSeconds }}
- --log-level={{ .Values.agent.logLevel }}
{{- range .Values.agent.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end -}}
