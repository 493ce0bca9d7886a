"""The front's resuming layer (replicas >= 2): a stream in flight when its replica is lost finishes on the twin.

Caddy keeps TLS, the key check and the health checks of everything else; it hands `POST /v1/chat/completions` and
`POST /v1/messages` to this program on the front's loopback. Resumable streams go through vLLM's own disaggregated
API: the request is rendered to token IDs by vLLM's CPU render server beside it (`vllm launch render`,
`/v1/chat/completions/render`, `/v1/messages/render`), the tokens come from a replica's `/inference/v1/generate`,
and each chunk of tokens is turned back into a chat chunk by a render server
(`/v1/chat/completions/derender`, its stream state carried here). So the chat template, the tokenizer and the
reasoning and tool-call parsers are the pinned engine's, and a cut changes nothing they see: the twin continues from
the prompt plus every token already delivered, with `max_tokens` lowered by their count.

Modules: `wire` (HTTP/1.1 and server-sent events over a socket, where silence is told from a loss), `pool` (the
replicas and their health), `render` (the render server's two slots: the one answering is called), `generation` (one
generation across replicas), `request` (what a client's body may be, and what of it an engine gets), `intake` (a
client's request taken within bounds: the HTTP side SGLang's chat layer serves with too), `chat` (one client
request, its resumed stream), `relay` (requests sent as they are to a replica's chat endpoint), `messages`
(Anthropic's events from chat chunks), `sglang` (SGLang replicas: their token door and SGLang's own chat route on
the front, kimi_cluster/node/sglang_chat.py), `server` (the HTTP server and the command line).
Standard library only: it runs on the front's own Python.
"""
