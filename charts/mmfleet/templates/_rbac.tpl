{{/*
The operator's RBAC rules (the same as manifests/base/rbac.yaml, where each one is explained; the contract test
tests/contract/test_manifests.py fails when they differ), split by scope. Where the operator may write is the
installer's explicit choice (docs/operator.md, "Where the operator acts"):
- watchNamespaces all plain names: the namespaced rules go into a Role in each of them and the ClusterRole keeps
  only cluster-scoped reads: writes never reach a namespace the operator does not watch;
- clusterWide: true: the ClusterRole holds every rule (watchNamespaces, if given, may then hold kopf patterns such
  as `ml-*`, which cannot be resolved at install time); the operator refuses fleets in the system namespaces;
- neither, or a pattern without clusterWide: the install fails, naming the values to set.
"mmfleet.namespacedOnly" is "true" in the first case, empty in the second.
*/}}
{{- define "mmfleet.namespacedOnly" -}}
{{- $plain := true -}}
{{- range .Values.watchNamespaces -}}
{{- if has . (list "kube-system" "kube-public" "kube-node-lease") -}}
{{- fail (printf "watchNamespaces: %q is a system namespace (kube-system, kube-public, kube-node-lease), where the operator never serves a fleet; list the namespaces your fleets are in" .) -}}
{{- end -}}
{{- if regexMatch "[*?!\\[]" . -}}{{- $plain = false -}}{{- end -}}
{{- end -}}
{{- if .Values.clusterWide -}}
{{- else if not .Values.watchNamespaces -}}
{{- fail "choose where the operator may write: set watchNamespaces to the namespaces of your fleets (e.g. --set 'watchNamespaces={ml,team-b}': a Role in each, no write right elsewhere), or clusterWide=true (a ClusterRole that writes Deployments, Services, ServiceAccounts and ConfigMaps in every namespace; fleets in kube-system, kube-public and kube-node-lease are refused). docs/operator.md, \"Where the operator acts\"" -}}
{{- else if not $plain -}}
{{- fail (printf "watchNamespaces: %s holds a pattern: the namespaces it matches are not known at install time, so the write rights would be a ClusterRole over every namespace; set clusterWide=true as well, or list the namespaces by name (no *, ?, [ or !)" (toJson .Values.watchNamespaces)) -}}
{{- else -}}true{{- end -}}
{{- end -}}

{{- define "mmfleet.clusterScopedRules" -}}
# kopf: scans the served resources at startup and watches CRDs, so the MultimodalInference
# CRD installed or upgraded after the operator started is picked up without a restart.
- apiGroups: [apiextensions.k8s.io]
  resources: [customresourcedefinitions]
  verbs: [list, watch]
# kopf, when restricted to namespaces (MMFLEET_NAMESPACES): lists and watches namespaces to
# match the names or patterns (e.g. `ml-*`) and to notice new ones. Without this it retries the
# forbidden list for about a minute on every start, serving nothing meanwhile, then falls back
# to exact names. Cluster-wide (the default) kopf does not read namespaces at all; the rule
# stays so that one environment variable switches modes. It reveals namespaces' names and
# labels, nothing inside them.
- apiGroups: [""]
  resources: [namespaces]
  verbs: [list, watch]
# Cloud detection from node providerIDs (kube.Kube.provider_ids) when spec.cloud and
# MMFLEET_DEFAULT_CLOUD are both `auto`.
- apiGroups: [""]
  resources: [nodes]
  verbs: [list]
{{- end -}}

{{- define "mmfleet.namespacedRules" -}}
# kopf posts kopf.event (handlers.records.kopf_event: transitions and the autoscaler's scale
# events included) as core v1 Events with POST only; it never patches them or uses events.k8s.io.
- apiGroups: [""]
  resources: [events]
  verbs: [create]
# The MultimodalInference: kopf watches it, and patches only metadata: it removes the finalizer
# an earlier version added (no handler of ours needs one). The operator never writes spec.
- apiGroups: [mmfleet.io]
  resources: [multimodalinferences]
  verbs: [list, watch, patch]
# handlers.records.write_status -> kube.Kube.patch_status (merge patch on the status subresource).
- apiGroups: [mmfleet.io]
  resources: [multimodalinferences/status]
  verbs: [patch]
# Children carry ownerReferences with blockOwnerDeletion: true (render._metadata). Where the
# OwnerReferencesPermissionEnforcement admission plugin is on, setting that requires `update`
# on the owner's finalizers subresource.
- apiGroups: [mmfleet.io]
  resources: [multimodalinferences/finalizers]
  verbs: [update]
# Children: applied (create+patch), watched (kopf indexes and watch_* event handlers); each is
# read (get) once before its first apply, so that an object of that name the fleet does not
# control is never adopted (handlers.reconcile._claim_names), and optional ones before pruning.
# delete: a fleet's endpoint picker (routing mode inferencePool; mmfleet.routing) is pruned with its Service
# and ServiceAccount when the fleet returns to routing mode service.
- apiGroups: [apps]
  resources: [deployments]
  verbs: [get, list, watch, create, patch, delete]
# The autoscaler sets replicas with server-side apply on the scale subresource (kube.Kube.scale);
# an apply there never creates anything, so patch is all it needs (checked on kube-apiserver 1.34).
- apiGroups: [apps]
  resources: [deployments/scale]
  verbs: [patch]
- apiGroups: [""]
  resources: [services, serviceaccounts]
  verbs: [get, list, watch, create, patch, delete]
# ConfigMaps come and go with the backend, so controller._prune deletes a stale one.
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [get, list, watch, create, patch]
# Each fleet's NetworkPolicy is applied (read once before, to adopt nothing) and watched, so that one
# deleted or opened by hand is restored at once; never pruned (every fleet has one).
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [get, list, watch, create, patch]
# PodMonitors are applied, pruned and watched (kopf's event handler watch_podmonitors: one deleted or
# edited by hand is restored at once), where the Prometheus Operator's CRD is served.
- apiGroups: [monitoring.coreos.com]
  resources: [podmonitors]
  verbs: [get, list, watch, create, patch, delete]
# Routing mode inferencePool (mmfleet.routing): the fleet's InferencePool, and an HTTPRoute when it names a
# Gateway, applied, watched and pruned where their CRDs are served; the picker's RoleBinding, which binds its
# ServiceAccount in the fleet's namespace to the picker's ClusterRole: `bind` is granted on that one ClusterRole by
# name (RBAC lets a binder bind only rights it holds itself, or what it may `bind`).
- apiGroups: [inference.networking.k8s.io]
  resources: [inferencepools]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [gateway.networking.k8s.io]
  resources: [httproutes]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [rbac.authorization.k8s.io]
  resources: [rolebindings]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [rbac.authorization.k8s.io]
  resources: [clusterroles]
  verbs: [bind]
  resourceNames: [{{ include "mmfleet.fullname" . }}-endpoint-picker]
# Pods are observed (kopf index fleet_pods) to explain why replicas are not ready, and with
# autoscaling.warmStandby patched: the mmfleet.io/serving label takes a sleeping replica out of its
# Service and InferencePool (autoscaler.standby).
- apiGroups: [""]
  resources: [pods]
  verbs: [list, watch, patch]
# Each new replica's server log is read once, its first 256 KiB, for where its start went
# (status.coldStart weights, engine and compile; handlers.autoscale._server_startups). Without it the
# ready phase stays whole.
- apiGroups: [""]
  resources: [pods/log]
  verbs: [get]
# A shared model cache's claim is read, never written, to say why it cannot serve every replica
# (status.shared_cache_problem).
- apiGroups: [""]
  resources: [persistentvolumeclaims]
  verbs: [get]
# TracingReady's CollectorNotReady: the collector Service's EndpointSlices, listed by its
# kubernetes.io/service-name label (handlers.discovery._ready_endpoints), at most once a minute per
# collector. Without it the Service is taken on trust (TracingReady True with no endpoint check).
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [list]
{{- end -}}
