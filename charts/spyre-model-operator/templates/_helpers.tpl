{{/* Chart name, truncated to a DNS label. */}}
{{- define "spyre.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Release full name: the release name when it already contains the chart name. */}}
{{- define "spyre.fullname" -}}
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

{{/* Cluster-scoped names carry the release namespace: two releases may share a name. */}}
{{- define "spyre.clusterName" -}}
{{- printf "%s-%s" .Release.Namespace (include "spyre.fullname" .) }}
{{- end }}

{{- define "spyre.selectorLabels" -}}
app.kubernetes.io/name: {{ include "spyre.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "spyre.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "spyre.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: spyre-model-operator
{{- end }}

{{- define "spyre.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "spyre.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "spyre.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* The Lease of this release: leader election among its replicas, and its identity on the
SpyreModels it writes (status.operator). Per release, so two releases in one namespace never
share it. */}}
{{- define "spyre.leaseName" -}}
{{- default (include "spyre.fullname" .) .Values.leaderElection.leaseName }}
{{- end }}

{{/* Leader election: on when asked, or whenever more than one replica runs. */}}
{{- define "spyre.leaderElect" -}}
{{- if or .Values.leaderElection.enabled (gt (int .Values.replicaCount) 1) }}true{{ end }}
{{- end }}

{{/* The namespaces the operator watches (validated: non-empty unless allNamespaces). */}}
{{- define "spyre.watchNamespaces" -}}
{{- if not .Values.watch.allNamespaces }}
{{- if not .Values.watch.namespaces }}
{{- fail "watch.namespaces must list at least one namespace when watch.allNamespaces is false" }}
{{- end }}
{{- join "," (uniq .Values.watch.namespaces) }}
{{- end }}
{{- end }}

{{/*
The API access the operator needs on its workloads, shared by the ClusterRole (all
namespaces) and the per-namespace Roles. Every rule names the code that needs it; see
README.md#rbac. Server-side apply is the `patch` verb, and it needs `create` too when the
object does not exist yet.
*/}}
{{- define "spyre.workloadRules" -}}
# handlers.py: kopf indices and event watches on SpyreModels (list + watch); kube/apply.py
# Applier.owner_exists: a list by name before a child is created (no get needed).
- apiGroups: ["serving.spyre.dev"]
  resources: ["spyremodels"]
  verbs: ["list", "watch"]
# kube/apply.py Applier.apply_status: server-side apply of the status subresource.
- apiGroups: ["serving.spyre.dev"]
  resources: ["spyremodels/status"]
  verbs: ["patch"]
# Children carry ownerReferences with blockOwnerDeletion: true; with the
# OwnerReferencesPermissionEnforcement admission plugin that needs update on the owner's
# finalizers subresource. Nothing else is written there.
- apiGroups: ["serving.spyre.dev"]
  resources: ["spyremodels/finalizers"]
  verbs: ["update"]
# Precompile Jobs: watched (index), created by server-side apply, owners merged with a
# merge patch (Applier.ensure_job), deleted when superseded or when the last owner is gone.
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["list", "watch", "create", "patch", "delete"]
# Serving Deployments: watched (all of them, so a same-named one that is not the operator's
# is reported, never taken over), server-side applied. The serving Deployment is deleted only
# by the garbage collector; a canary Deployment (<model>-canary, spec.serving.canary) is deleted
# by the operator when its canary ends (passed and rolled out, failed, or turned off).
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["list", "watch", "create", "patch", "delete"]
# Serving Services (watched as Deployments): server-side applied.
- apiGroups: [""]
  resources: ["services"]
  verbs: ["list", "watch", "create", "patch"]
# Cache PVCs: server-side applied; a managed claim (retainPolicy Delete) a model moved off is
# deleted once no SpyreModel names it and no pod of the operator mounts it (control/claims.py).
- apiGroups: [""]
  resources: ["persistentvolumeclaims"]
  verbs: ["list", "watch", "create", "patch", "delete"]
# PodDisruptionBudgets: watched (as Deployments), server-side applied, deleted when replicas
# drop below 2.
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["list", "watch", "create", "patch", "delete"]
# HorizontalPodAutoscalers of autoscaled models (spec.autoscaling): watched (as Deployments),
# server-side applied, deleted when autoscaling is turned off.
- apiGroups: ["autoscaling"]
  resources: ["horizontalpodautoscalers"]
  verbs: ["list", "watch", "create", "patch", "delete"]
# NetworkPolicies of models with serving.allowFrom: watched (as Deployments), server-side
# applied, deleted when allowFrom is removed.
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["list", "watch", "create", "patch", "delete"]
# <model>-output-check: the artifact whose output check passed (desired/verified.py), read by
# its serving pods' env; watched (as Deployments), server-side applied, collected with the model.
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["list", "watch", "create", "patch"]
{{- if .Values.scaleToZero.enabled }}
# Scale to zero (autoscaling.minReplicas 0; reconcile.decide_scale_to_zero): the
# <model>-engine and <model>-coldstart Services are deleted when zero is switched off.
- apiGroups: [""]
  resources: ["services"]
  verbs: ["delete"]
# KEDA's ScaledObjects and the HTTP add-on's HTTPScaledObjects: listed and watched (the CRDs
# may be absent: control/optional.py), server-side applied, deleted when zero is switched off.
- apiGroups: ["keda.sh"]
  resources: ["scaledobjects"]
  verbs: ["list", "watch", "create", "patch", "delete"]
- apiGroups: ["http.keda.sh"]
  resources: ["httpscaledobjects"]
  verbs: ["list", "watch", "create", "patch", "delete"]
# The EndpointSlice mirroring the interceptor's endpoints into a scale-to-zero model's
# selector-less Service: indexed by kopf (only with scale to zero on:
# handlers.register_mirror_slice_handlers), server-side applied, deleted with zero.
- apiGroups: ["discovery.k8s.io"]
  resources: ["endpointslices"]
  verbs: ["list", "watch", "create", "patch", "delete"]
{{- end }}
# control/controller.py: precompile pods' termination messages and why they do not start, serving
# pods' crash loops (a plain list, no watch).
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list"]
# DRA (accelerator.deviceClassName, desired/devices.py): a model's ResourceClaimTemplates are
# listed by its label (control/devices.py; no watch), server-side applied, and deleted once
# no spec of the model wants one and no pod of it was made from it (decide/devices.py).
- apiGroups: ["resource.k8s.io"]
  resources: ["resourceclaimtemplates"]
  verbs: ["list", "create", "patch", "delete"]
# Its serving pods' ResourceClaims, read by name: the devices allocated (status.devices).
- apiGroups: ["resource.k8s.io"]
  resources: ["resourceclaims"]
  verbs: ["get"]
# spec.routing.inferencePool (control/optional.py, desired/inference_pool.py): InferencePools are listed and
# watched (the CRD may be absent), server-side applied, deleted when routing is removed.
- apiGroups: ["inference.networking.k8s.io"]
  resources: ["inferencepools"]
  verbs: ["list", "watch", "create", "patch", "delete"]
# Applier.event (and kopf's own warnings): Events on SpyreModels. Listed (no watch) only
# while a precompile Job has no pod: the Job controller's FailedCreate says why (a quota).
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "list"]
# gc.py: the GC pod's ServiceAccount "spyre-gc", a Role that may only list pods, Jobs and
# Deployments (held above, so the operator may grant it) and their RoleBinding, one of each
# per namespace, server-side applied before each GC Job; removed with their owners.
- apiGroups: [""]
  resources: ["serviceaccounts"]
  verbs: ["create", "patch"]
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["roles", "rolebindings"]
  verbs: ["create", "patch"]
{{- end }}

{{/* podUser resolved: "assigned" or "fixed" (values.yaml). */}}
{{- define "spyre.podUser" -}}
{{- if eq .Values.podUser "auto" -}}
{{- if .Capabilities.APIVersions.Has "security.openshift.io/v1" -}}assigned{{- else -}}fixed{{- end -}}
{{- else -}}
{{- .Values.podUser -}}
{{- end -}}
{{- end }}

{{/* The operator pod's securityContext: podSecurityContext, plus its uid, gid and fsGroup
     when podUser resolves to fixed (values given in podSecurityContext win). */}}
{{- define "spyre.podSecurityContext" -}}
{{- $psc := deepCopy .Values.podSecurityContext -}}
{{- if eq (include "spyre.podUser" .) "fixed" -}}
{{- $psc = merge $psc (dict "runAsUser" 65532 "runAsGroup" 65532 "fsGroup" 65532) -}}
{{- end -}}
{{- toYaml $psc -}}
{{- end }}

{{/* requiredSCC resolved: the SCC name pods pin, or "" for none. */}}
{{- define "spyre.requiredSCC" -}}
{{- if eq .Values.requiredSCC "auto" -}}
{{- if eq (include "spyre.podUser" .) "assigned" -}}restricted-v2{{- end -}}
{{- else -}}
{{- .Values.requiredSCC -}}
{{- end -}}
{{- end }}

{{/* The operator monitor's endpoint: its token (operator.metricsAuth) and HTTPS
     (operator.metricsTLS). Called with (list $ <scraper ServiceAccount name>). */}}
{{- define "spyre.operatorScrapeAuth" -}}
{{- $ := index . 0 }}
{{- if $.Values.operator.metricsAuth }}
authorization:
  type: Bearer
  credentials:
    name: {{ index . 1 }}-token
    key: token
{{- end }}
{{- if $.Values.operator.metricsTLS.secretName }}
scheme: https
{{- with $.Values.monitoring.operator.tlsConfig }}
tlsConfig:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}
{{- end }}
