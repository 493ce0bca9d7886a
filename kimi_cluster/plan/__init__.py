"""The plan (pure): what the stack will build, worked out from the settings with no Pulumi resource made.

The engines' command lines (launch, warmup), the proxy's and the front's configuration, the least-privilege rule
set (firewall), the node steps' scripts (step_scripts, from templates/ in this package), the cost quote (pricing),
the client configs other teams paste, and the blueprint that reads the settings once for the deployment.
"""
