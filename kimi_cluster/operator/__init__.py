"""The operator's tools, as a library: what `kimi-cluster plan`, `kimi-cluster status` and `kimi-cluster timeline`
print.

`pulumi up` imports none of this package (the program's own room is the rest of components/): the offline plan
(plan_report, bringup), the status of a running stack (status_gather over SSH, status_replicas, status_report,
engine_metrics, node_exec, stack_state) and the bring-up timeline (timeline_report).
"""
