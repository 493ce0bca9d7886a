"""A local stand-in for the Kimi K3.1 Pro endpoint: OpenAI and Anthropic routes in SGLang's, vLLM's or TokenSpeed's
shape. Scripted answers that depend on the request (tool results, real pixels, prior reasoning), plus --fault modes.

Like vLLM 0.33 (vllm/entrypoints/serve/middleware/authenticate.py guards only /v1, /v2, /inference, /cohere), the
vLLM shape serves /invocations (full inference) and /tokenize without the key, and both shapes /metrics: the holes the
head's proxy closes. TokenSpeed's shape is its smg gateway's (tokenspeed-smg 1.10.1): the thinking as
`reasoning_content`, no /metrics on the API port but on a Prometheus listener of its own (--prometheus-host/-port),
smg_router_requests_total and smg_router_tokens_total{token_type="input"|"output"}, tokens counted for streamed chat
and Anthropic messages only (smg's metrics docs).

One concern a module: `settings` (how it behaves, its faults), `png` (seeing an image), `media` (an image fetched
by URL, and vLLM's answer when it cannot be), `compose` (the scripted turn), `wire` (the OpenAI and Anthropic
shapes), `handler` (the HTTP routes and counters), `server` (`FakeInferenceServer`), `cli` (the engine-style command
line) and `warmup` (the kernel cache).
`kimi_cluster.fakes.inference_server` re-exports the names its callers use and runs the command line.
"""
