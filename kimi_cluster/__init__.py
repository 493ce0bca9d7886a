"""kimi-cluster: Kimi K3.1 Pro on Hyperstack GPU VMs with one `pulumi up`.

Rooms, from the ground up (each imports only from the rooms below it): node (the programs shipped to the VMs),
hyperstack (the API client), settings, plan (pure), deploy (the Pulumi graph and the Hyperstack providers), checks
(the endpoint checks and the verification stack), operator (plan, status and timeline as a library), fakes and
sandbox (the local stand-ins), cli (the `kimi-cluster` command).

Kept empty of imports: the node programs ship with an empty copy of this file, and every door imports only what it
needs.
"""
