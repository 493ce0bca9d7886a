"""A local emulator of the Hyperstack API (`/v1/core/...`) for tests and the sandbox, on a stdlib HTTP server.

Same paths, payload rules, error bodies and asynchronous VM lifecycle as the real API; faults injected on demand.
One concept a module:

- `emulator`: the `Emulator` (start, stop, the test controls).
- `state`: the account (`Cloud`, its VMs, rules and bills) and the lifecycle's timing; `catalog`: what it offers.
- `answers`: its answers, built as the API's record shapes of kimi_cluster/hyperstack_api/records.py.
- `payloads`: request validation as the vendor SDK's models; `query`: query parameters and paging.
- `routes`: the route table, to the endpoints in `catalog_api`, `environments`, `vms`, `rules` and `billing`.
- `lifecycle`: a VM's phases, from the clock; `power`: a stop or start under way; `drift_injection`: the API's stop
  and start, and the admin route that changes a VM behind the stack's back.
- `faults`: what a test arms, and the book that holds it.
- `dispatch`: one request's pipeline, with the fault injection points; `request_log`: every request recorded.
- `controls` and `admin`: what a test changes or reads, directly or over /_emulator/; `server`: the HTTP side.
"""
