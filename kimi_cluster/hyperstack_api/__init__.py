"""The Hyperstack API client: requests with bounded retries (api), the API's record shapes (records), and the stock
and pricebook reads (market). No Pulumi here: the settings, the plan, the operator's tools and the dynamic providers
(kimi_cluster.deploy.hyperstack_providers) all use it.
"""

from kimi_cluster.hyperstack_api.api import ApiSettings, HyperstackClient, HyperstackError

__all__ = ["ApiSettings", "HyperstackClient", "HyperstackError"]
