"""kwok's stages for the scale harness (:mod:`tests.framework.scale`): how kwok moves
the hollow Nodes and their pods through their lifecycle."""

# kwok's stages (kwok.x-k8s.io/v1alpha1 Stage; selectors are jq expressions). Node:
# Ready once. Pod: bound -> Pending with its conditions and a waiting container; the
# hollow kubelet's annotation -> Running with the image's digest; deleted -> gone.
STAGES = """\
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: hollow-node-ready
spec:
  resourceRef: {apiGroup: v1, kind: Node}
  selector:
    matchExpressions:
    - key: '.status.conditions.[] | select( .type == "Ready" ) | .status'
      operator: NotIn
      values: ['True']
  next:
    statusTemplate: |
      {{ $now := Now }}
      phase: Running
      addresses:
      - {type: InternalIP, address: "@ADDRESS@"}
      - {type: Hostname, address: {{ .metadata.name | Quote }}}
      conditions:
      {{ range NodeConditions }}
      - type: {{ .type | Quote }}
        status: {{ .status | Quote }}
        reason: {{ .reason | Quote }}
        message: {{ .message | Quote }}
        lastHeartbeatTime: {{ $now | Quote }}
        lastTransitionTime: {{ $now | Quote }}
      {{ end }}
      allocatable: {cpu: "1k", memory: "1Ti", pods: "1M"}
      capacity: {cpu: "1k", memory: "1Ti", pods: "1M"}
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: hollow-pod-pending
spec:
  resourceRef: {apiGroup: v1, kind: Pod}
  selector:
    matchExpressions:
    - {key: '.metadata.deletionTimestamp', operator: DoesNotExist}
    - {key: '.status.hostIP', operator: DoesNotExist}
  next:
    statusTemplate: |
      {{ $now := Now }}
      phase: Pending
      hostIP: "@ADDRESS@"
      startTime: {{ $now | Quote }}
      conditions:
      - {type: PodScheduled, status: "True", lastTransitionTime: {{ $now | Quote }}}
      - {type: Initialized, status: "True", lastTransitionTime: {{ $now | Quote }}}
      - {type: Ready, status: "False", reason: ContainersNotReady,
         lastTransitionTime: {{ $now | Quote }}}
      containerStatuses:
      {{ range .spec.containers }}
      - name: {{ .name | Quote }}
        image: {{ .image | Quote }}
        imageID: ""
        ready: false
        restartCount: 0
        state: {waiting: {reason: ContainerCreating}}
      {{ end }}
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: hollow-pod-running
spec:
  resourceRef: {apiGroup: v1, kind: Pod}
  selector:
    matchExpressions:
    - {key: '.metadata.deletionTimestamp', operator: DoesNotExist}
    - {key: '.status.phase', operator: In, values: [Pending]}
    - {key: '.status.hostIP', operator: Exists}
    - {key: '.metadata.annotations["@PULLED@"]', operator: Exists}
  next:
    statusTemplate: |
      {{ $now := Now }}
      {{ $digest := index .metadata.annotations "@PULLED@" }}
      phase: Running
      conditions:
      - {type: Ready, status: "True", lastTransitionTime: {{ $now | Quote }}}
      - {type: ContainersReady, status: "True", lastTransitionTime: {{ $now | Quote }}}
      containerStatuses:
      {{ range .spec.containers }}
      - name: {{ .name | Quote }}
        image: {{ .image | Quote }}
        imageID: {{ $digest | Quote }}
        ready: true
        started: true
        restartCount: 0
        state: {running: {startedAt: {{ $now | Quote }}}}
      {{ end }}
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: hollow-pod-delete
spec:
  resourceRef: {apiGroup: v1, kind: Pod}
  selector:
    matchExpressions:
    - {key: '.metadata.deletionTimestamp', operator: Exists}
  next:
    finalizers: {empty: true}
    delete: true
"""
