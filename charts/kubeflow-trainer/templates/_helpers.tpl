{{/*
Names. With the documented release name `kubeflow-trainer`, the full name is `kubeflow-trainer`
and the operator's Deployment, Service and ServiceAccount are `kubeflow-trainer-controller-manager`,
as in upstream's chart.
*/}}
{{- define "trainer.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "trainer.fullname" -}}
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

{{- define "trainer.manager.name" -}}
{{- printf "%s-controller-manager" (include "trainer.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "trainer.configmap.name" -}}
{{- printf "%s-config" (include "trainer.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "trainer.leaderElection.name" -}}
{{- printf "%s-leader-election" (include "trainer.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Where the leader election Lease is, and the Role that lets the operator write it. */}}
{{- define "trainer.leaderElection.namespace" -}}
{{- .Values.manager.config.leaderElection.resourceNamespace | default .Release.Namespace }}
{{- end }}

{{- define "trainer.webhook.secret.name" -}}
{{- if and (not .Values.certManager.enabled) .Values.webhook.existingSecret.name }}
{{- .Values.webhook.existingSecret.name }}
{{- else }}
{{- (.Values.manager.config.certManagement | default dict).webhookSecretName | default (printf "%s-webhook-cert" (include "trainer.fullname" .) | trunc 63 | trimSuffix "-") }}
{{- end }}
{{- end }}

{{/*
Where the webhooks' serving certificate comes from: `certManager` (certManager.enabled), `secret`
(webhook.existingSecret.name, the user's), or `operator` (the default: the operator makes, renews
and injects its own, so nothing in the rendered chart changes from one render to the next).
*/}}
{{- define "trainer.webhook.certSource" -}}
{{- if and .Values.certManager.enabled .Values.webhook.existingSecret.name }}
{{- fail "certManager.enabled and webhook.existingSecret.name both name the webhook certificate's source: set one" }}
{{- end }}
{{- if .Values.certManager.enabled }}certManager{{ else if .Values.webhook.existingSecret.name }}secret
{{- else if not (dig "enable" true (.Values.manager.config.certManagement | default dict)) }}
{{- fail "manager.config.certManagement.enable is false, and no other source of the webhook certificate is set: set certManager.enabled or webhook.existingSecret.name" }}
{{- else }}operator{{ end }}
{{- end }}

{{/* The Service the API server calls for the webhooks (and Prometheus scrapes). */}}
{{- define "trainer.service.name" -}}
{{- (.Values.manager.config.certManagement | default dict).webhookServiceName | default (include "trainer.manager.name" .) }}
{{- end }}

{{/*
Labels.
*/}}
{{- define "trainer.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "trainer.selectorLabels" -}}
app.kubernetes.io/name: {{ include "trainer.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "trainer.labels" -}}
helm.sh/chart: {{ include "trainer.chart" . }}
{{ include "trainer.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: kubeflow
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "trainer.manager.selectorLabels" -}}
{{ include "trainer.manager.ownSelectorLabels" . }}
{{- include "trainer.manager.keptSelectorLabels" . }}
{{- end }}

{{- /* What this release selects the operator's pods with, before any kept from an upgrade. */ -}}
{{- define "trainer.manager.ownSelectorLabels" -}}
{{ include "trainer.selectorLabels" . }}
app.kubernetes.io/component: manager
{{- with .Values.manager.selectorLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- /*
A Deployment's selector cannot change, so an upgrade of a release whose Deployment selects with
labels ours does not (upstream's chart adds app.kubernetes.io/part-of) keeps them: each label of
the existing selector that our pods carry with the same value is selected on too. A selector this
release cannot keep fails here, naming the label, rather than at the API server ("field is
immutable"). Nothing is looked up by `helm template` (nor by tools that render with it), or on a
fresh install: there, set manager.selectorLabels.
*/ -}}
{{- define "trainer.manager.keptSelectorLabels" -}}
{{- $name := include "trainer.manager.name" . }}
{{- $existing := lookup "apps/v1" "Deployment" .Release.Namespace $name }}
{{- $selector := dig "spec" "selector" "matchLabels" dict ($existing | default dict) }}
{{- if $selector }}
{{- $ours := include "trainer.manager.ownSelectorLabels" . | fromYaml }}
{{- $pod := include "trainer.manager.labels" . | fromYaml }}
{{- range $key, $value := $ours }}
{{- if not (hasKey $selector $key) }}
{{- fail (printf "the Deployment %s does not select its pods on %s, which this release would add to its selector: a Deployment's selector cannot change (delete the Deployment before the upgrade)" $name $key) }}
{{- else if ne (toString (get $selector $key)) (toString $value) }}
{{- fail (printf "the Deployment %s selects its pods with %s=%s, this release with %s=%s: a Deployment's selector cannot change" $name $key (get $selector $key) $key $value) }}
{{- end }}
{{- end }}
{{- range $key, $value := $selector }}
{{- if not (hasKey $ours $key) }}
{{- if and (hasKey $pod $key) (eq (toString (get $pod $key)) (toString $value)) }}
{{ $key }}: {{ $value | quote }}
{{- else }}
{{- fail (printf "the Deployment %s selects its pods with %s=%s, a label this chart's pods do not carry: set manager.selectorLabels.%s=%s (a Deployment's selector cannot change)" $name $key $value $key $value) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{- define "trainer.manager.labels" -}}
{{- range $key, $_ := .Values.manager.selectorLabels }}
{{- if or (hasKey ($.Values.manager.labels | default dict) $key) (hasKey ($.Values.commonLabels | default dict) $key) }}
{{- fail (printf "manager.selectorLabels.%s is also in manager.labels or commonLabels: a pod would not match its own selector" $key) }}
{{- end }}
{{- end }}
{{ include "trainer.labels" . }}
app.kubernetes.io/component: manager
{{- with .Values.manager.selectorLabels }}
{{ toYaml . }}
{{- end }}
{{- with .Values.manager.labels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
The operator's image: [registry/]repository:tag, the tag defaulting to the chart's appVersion.
*/}}
{{- define "trainer.image" -}}
{{- $repository := .Values.image.repository }}
{{- if .Values.image.registry }}
{{- $repository = printf "%s/%s" .Values.image.registry .Values.image.repository }}
{{- end }}
{{- printf "%s:%s" $repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}

{{/*
Ports and addresses from manager.config: ":8080" -> 8080; ":8081" -> "0.0.0.0:8081".
*/}}
{{- define "trainer.port" -}}
{{- regexReplaceAll "^.*:" . "" }}
{{- end }}

{{- /* "true" when the operator serves metrics (bindAddress "0": none). */ -}}
{{- define "trainer.metrics.enabled" -}}
{{- if ne (toString .Values.manager.config.metrics.bindAddress) "0" }}true{{ end }}
{{- end }}

{{- /* "true" when only callers the API server authorizes read them: auth over HTTPS only. */ -}}
{{- define "trainer.metrics.auth" -}}
{{- $m := .Values.manager.config.metrics }}
{{- if and (include "trainer.metrics.enabled" .) (include "trainer.metrics.secure" .) (dig "auth" "enabled" true $m) }}true{{ else }}false{{ end }}
{{- end }}

{{- /* "true" when the metrics are served over HTTPS. The defaults stand in for keys a values file
of an earlier chart lacks (`helm upgrade --reuse-values`). */ -}}
{{- define "trainer.metrics.secure" -}}
{{- if dig "secureServing" true .Values.manager.config.metrics }}true{{ end }}
{{- end }}

{{- /* Fails the render when two of the operator's servers would listen on one port (the
Service and the Pod would carry the port twice; the operator refuses the Configuration). */ -}}
{{- define "trainer.checkPorts" -}}
{{- $c := .Values.manager.config }}
{{- $ports := dict (toString $c.webhook.port) "manager.config.webhook.port" }}
{{- $others := list (list "manager.config.health.healthProbeBindAddress" (include "trainer.port" $c.health.healthProbeBindAddress)) }}
{{- if include "trainer.metrics.enabled" . }}
{{- $others = prepend $others (list "manager.config.metrics.bindAddress" (include "trainer.port" $c.metrics.bindAddress)) }}
{{- end }}
{{- if include "trainer.statusServer.enabled" . }}
{{- $others = append $others (list "manager.config.statusServer.port" (toString $c.statusServer.port)) }}
{{- end }}
{{- range $others }}
{{- $field := index . 0 }}
{{- $port := index . 1 }}
{{- if hasKey $ports $port }}
{{- fail (printf "%s and %s are both port %s: each server of the operator needs its own" (get $ports $port) $field $port) }}
{{- end }}
{{- $_ := set $ports $port $field }}
{{- end }}
{{- end }}

{{- define "trainer.listenAddress" -}}
{{- if hasPrefix ":" . }}{{ printf "0.0.0.0%s" . }}{{ else }}{{ . }}{{ end }}
{{- end }}

{{/* Where the pod mounts the operator's configuration and the webhook's certificate. */}}
{{- define "trainer.configDir" -}}/etc/kubeflow-trainer/config{{- end }}
{{- /* A mounted Secret (cert-manager's, the user's), or where the operator writes its own (under /tmp). */}}
{{- define "trainer.certDir" -}}
{{- if eq (include "trainer.webhook.certSource" .) "operator" }}/tmp/k8s-webhook-server/serving-certs
{{- else }}/etc/kubeflow-trainer/webhook-certs
{{- end }}
{{- end }}

{{/*
The operator's configuration file (trainer run --config), from manager.config. Upstream's key
`groupKindConcurrency.trainJob` becomes the kind-qualified key the operator reads.
*/}}
{{- /* "true" when the TrainJobStatus feature gate is on: the status server runs. */ -}}
{{- define "trainer.statusServer.enabled" -}}
{{- if (get .Values.manager.config.featureGates "TrainJobStatus") }}true{{ end }}
{{- end }}

{{- define "trainer.operatorConfig" -}}
{{- $c := .Values.manager.config }}
apiVersion: config.trainer.kubeflow.org/v1alpha1
kind: Configuration
clientConnection:
  qps: {{ $c.clientConnection.qps }}
  burst: {{ $c.clientConnection.burst }}
controller:
  groupKindConcurrency:
    TrainJob.trainer.kubeflow.org: {{ $c.controller.groupKindConcurrency.trainJob }}
    TrainingRuntime.trainer.kubeflow.org: {{ $c.controller.groupKindConcurrency.trainingRuntime | default 1 }}
    ClusterTrainingRuntime.trainer.kubeflow.org: {{ $c.controller.groupKindConcurrency.clusterTrainingRuntime | default 1 }}
webhook:
  enabled: true
  {{- /* Each bind address is written out, the empty one too: the operator's defaults differ outside a
  cluster (loopback), so what the pod binds never depends on them. The configurations are the chart's. */}}
  host: {{ $c.webhook.host | default "" | quote }}
  port: {{ $c.webhook.port }}
  certDir: {{ include "trainer.certDir" . }}
  manageConfiguration: false
{{- if eq (include "trainer.webhook.certSource" .) "operator" }}
{{- $cert := .Values.webhook.operatorCertificate }}
certManagement:
  enable: true
  webhookServiceName: {{ include "trainer.service.name" . | quote }}
  webhookSecretName: {{ include "trainer.webhook.secret.name" . | quote }}
  webhookSecretNamespace: {{ .Release.Namespace | quote }}
  validatingWebhookConfigurationName: validator.trainer.kubeflow.org
  mutatingWebhookConfigurationName: defaulter.trainer.kubeflow.org
  caValidity: {{ $cert.caValidity | quote }}
  certValidity: {{ $cert.certValidity | quote }}
  checkInterval: {{ $cert.checkInterval | quote }}
{{- else }}
certManagement:
  enable: false
{{- end }}
metrics:
  bindAddress: {{ $c.metrics.bindAddress | quote }}
  secureServing: {{ include "trainer.metrics.secure" . | eq "true" }}
  auth:
    enabled: {{ include "trainer.metrics.auth" . | eq "true" }}
{{- if eq ($c.health.readinessEndpointName | default "readyz") ($c.health.livenessEndpointName | default "healthz") }}
{{- fail "manager.config.health.readinessEndpointName and livenessEndpointName must differ" }}
{{- end }}
health:
  healthProbeBindAddress: {{ $c.health.healthProbeBindAddress | quote }}
  readinessEndpointName: {{ $c.health.readinessEndpointName | default "readyz" | quote }}
  livenessEndpointName: {{ $c.health.livenessEndpointName | default "healthz" | quote }}
leaderElection:
  leaderElect: {{ $c.leaderElection.leaderElect }}
  resourceName: {{ $c.leaderElection.resourceName | quote }}
  resourceNamespace: {{ include "trainer.leaderElection.namespace" . | quote }}
  leaseDuration: {{ $c.leaderElection.leaseDuration | quote }}
  renewDeadline: {{ $c.leaderElection.renewDeadline | quote }}
  retryPeriod: {{ $c.leaderElection.retryPeriod | quote }}
featureGates: {{ $c.featureGates | toJson }}
statusServer:
  {{- /* Every interface of the pod, said here: unset, an operator outside a cluster binds loopback. */}}
  host: "0.0.0.0"
  port: {{ $c.statusServer.port }}
  qps: {{ $c.statusServer.qps }}
  burst: {{ $c.statusServer.burst }}
  {{- $service := printf "https://%s.%s.svc:%v" (include "trainer.service.name" .) .Release.Namespace $c.statusServer.port }}
  advertisedURL: {{ $c.statusServer.advertisedURL | default $service | quote }}
plugins:
  disabled: {{ $c.plugins.disabled | toJson }}
  allowed: {{ $c.plugins.allowed | toJson }}
{{- with $c.tls }}
tls:
  minVersion: {{ .minVersion | default "" | quote }}
  cipherSuites: {{ .cipherSuites | default list | toJson }}
  nextProtos: {{ .nextProtos | default list | toJson }}
{{- end }}
{{- end }}
