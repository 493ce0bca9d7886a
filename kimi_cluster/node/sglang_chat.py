"""SGLang's own chat layer on the front's CPU, for the resuming layer (kimi_cluster/node/resume/sglang.py).

`python3 -m kimi_cluster.node.sglang_chat MODEL --served-model-name NAME --host 127.0.0.1 --port PORT` runs in the
replicas' own SGLang image (as vLLM's `vllm launch render` runs in theirs): SGLang 0.5.23 has no render server,
and its chat route is Python that needs no GPU. So this program builds that route, `OpenAIServingChat`, with the
replicas' chat flags (`--tool-call-parser kimi_k3 --reasoning-parser kimi_k3`) over the model's tokenizer, and
serves three calls on loopback:

- `POST /v1/chat/completions/render`: a chat completion body in, SGLang's GenerateReqInput out, made by the route's
  own `_convert_to_internal_request` (sglang/srt/entrypoints/openai/serving_chat.py): the prompt's token ids as the
  model's tokenizer renders them, the sampling parameters the route adds (Kimi K3's `skip_special_tokens` false,
  the tools section's close as a stop string, the tool turn's structural tag) and `require_reasoning`. It opens the
  stream's state: the route's own `_generate_chat_stream`, fed by this program instead of an engine.
- `POST /v1/chat/completions/derender`: a chunk of output token ids (and the finish, when it came) in, the chat
  chunks SGLang's route makes of it out. The ids are decoded as SGLang's detokenizer decodes them (a character still
  incomplete held back, the matched stop trimmed: `DetokenizerManager.trim_matched_stop`), and the route's stream
  runs its ReasoningParser and FunctionCallParser over the text, kept from the first chunk to the last, wherever
  each token was generated. The usage it reports counts the original prompt and every token.
- `POST /v1/chat/completions/resume`: every token delivered so far in; whether the stream can carry on exactly on
  another replica from the prompt plus those tokens, and with which `require_reasoning`. SGLang starts a request's
  grammar afresh: a Kimi K3 tool turn's structural tag (kimik3_structural_tag.py: free text until
  `<|open|>tools<|sep|>`, then only calls) is in its first state only before the tools section opens, and its
  reasoner (ReasonerGrammarObject) waits for the end of reasoning only while reasoning. A cut inside the tools
  section, or part way into a stop string or a reasoning end, is refused (409).

Each stream's state is held here, at most MAX_STREAMS at once, each dropped IDLE_S after its last call. Each caller
is held to the resuming layer's own bounds (kimi_cluster/node/resume/intake.py and request.py, shipped beside this
program): the whole request within `--client-timeout-s` of the connection (408), a body of at most MAX_BODY (413)
by a Content-Length that is a number (400 naming it), JSON bounded in size and depth (400), and a 4xx naming the
field for a field this layer cannot take.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import threading
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

from kimi_cluster.node.resume import intake, request
from kimi_cluster.node.resume.request import BadRequest

MAX_STREAMS = 4096
IDLE_S = 900.0
# A render call carries a client's body (at most what the resuming layer takes, intake.MAX_BODY) as the layer sends it
# on (request.encoded): a separator gains a space, and a body with a lone surrogate is sent ASCII-escaped, each
# character of two or three UTF-8 bytes six; so up to three times as large.
MAX_BODY = 3 * intake.MAX_BODY
TOKEN_ID_END = 1 << 31  # SGLang's token ids are int32
NEED, END = "need", "end"  # from a stream's pump: it waits for the next output; its chat stream ended


class Stream:
    """One chat stream: SGLang's `_generate_chat_stream`, fed output by `feed`, its SSE lines read from `out`."""

    def __init__(self, request: Any, adapted: Any, prompt_tokens: int) -> None:
        self.request, self.adapted, self.prompt_tokens = request, adapted, prompt_tokens
        self.feed: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        self.out: asyncio.Queue[Any] = asyncio.Queue()
        self.ids: list[int] = []
        self.text = ""  # the cumulative text handed to the route so far
        self.used = time.monotonic()
        self.lock = threading.Lock()
        self.pump: asyncio.Future[None] | None = None  # the task running the route's stream, held while it runs


class ChatLayer:
    def __init__(self, model: str, served_name: str, revision: str | None, trust_remote_code: bool) -> None:
        # SGLang's own modules, loaded here only: the engine's image has them, the front's Python does not.
        from sglang.srt.configs.model_config import ModelConfig
        from sglang.srt.entrypoints.openai.serving_chat import OpenAIServingChat
        from sglang.srt.function_call import kimik3_format
        from sglang.srt.managers.detokenizer_manager import DetokenizerManager
        from sglang.srt.parser.template_manager import TemplateManager
        from sglang.srt.runtime_context import publish
        from sglang.srt.server_args import ServerArgs
        from sglang.srt.utils.hf_transformers_utils import get_tokenizer

        args = ServerArgs(model_path=model, revision=revision, served_model_name=served_name, device="cpu",
                          tool_call_parser="kimi_k3", reasoning_parser="kimi_k3",
                          trust_remote_code=trust_remote_code, skip_server_warmup=True)
        publish(args, role="tokenizer")
        self.tokenizer = get_tokenizer(model, revision=revision, trust_remote_code=trust_remote_code)
        self.markers = kimik3_format
        self.trim = DetokenizerManager.trim_matched_stop
        self.trim_self = type("Trim", (), {"is_tool_call_parser_gpt_oss": False, "tool_close_token_ids": ()})()
        self.streams: dict[str, Stream] = {}
        self.lock = threading.Lock()
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="chat route", daemon=True).start()

        layer = self

        class EngineStandIn:
            """What the chat route asks of SGLang's TokenizerManager: its config, tokenizer, and generate_request,
            which here yields the outputs the resuming layer posts."""

            model_config = ModelConfig.from_server_args(args)
            tokenizer = self.tokenizer
            model_path, served_model_name, server_args = model, served_name, args

            def config_value(self, name: str) -> Any:
                return getattr(args, name)

            async def generate_request(self, adapted: Any, _raw: Any = None) -> AsyncIterator[dict[str, Any]]:
                stream = layer.streams[adapted.rid]
                while True:
                    if stream.feed.empty():
                        stream.out.put_nowait(NEED)
                    item = await stream.feed.get()
                    if item is None:
                        return
                    yield item

        engine = EngineStandIn()
        templates = TemplateManager()
        templates.initialize_templates(tokenizer_manager=engine, model_path=model)
        self.route = OpenAIServingChat(engine, templates)

    def _run(self, coroutine: Any, timeout_s: float = 60.0) -> Any:
        future = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        try:
            return future.result(timeout_s)
        except TimeoutError:  # the lines it was waiting for go to the stream's next call
            future.cancel()
            raise BadRequest(500, f"SGLang's chat route did not answer within {timeout_s:g} s") from None

    # ---- the three calls

    def render(self, body: dict[str, Any]) -> dict[str, Any]:
        from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest

        self._reap()
        rid = str(body.pop("request_id", "") or "")
        if not rid or len(rid) > 200:
            raise BadRequest(400, "request_id: the resuming layer's own id is required", "request_id")
        body = dict(body, stream=True, stream_options={"include_usage": True})
        try:
            request = ChatCompletionRequest.model_validate(body)
            adapted, request = self.route._convert_to_internal_request(request)
        except ValueError as exc:  # pydantic's ValidationError is one
            raise invalid(exc) from None
        if adapted.input_ids is None:
            raise BadRequest(400, "this request does not render to token ids (media is served by the replica itself)")
        adapted.rid = rid
        params = {k: v for k, v in adapted.sampling_params.items() if v is not None}
        generate = {"rid": rid, "input_ids": list(adapted.input_ids), "sampling_params": params,
                    "require_reasoning": bool(adapted.require_reasoning), "stream": True}
        answer: dict[str, Any] = {"stream": rid, "generate": generate, "not_resumable": self._refused(params)}
        if answer["not_resumable"] is None:
            with self.lock:
                if len(self.streams) >= MAX_STREAMS:
                    raise BadRequest(503, f"{MAX_STREAMS} streams are open on this chat layer")
                if rid in self.streams:
                    raise BadRequest(400, "request_id: a stream with this id is open", "request_id")
                stream = self.streams[rid] = Stream(request, adapted, len(adapted.input_ids))
            self._run(self._start(stream))
        return answer

    def derender(self, body: dict[str, Any]) -> dict[str, Any]:
        ids, finish = output_ids(body), body.get("finish")
        if finish is not None and not isinstance(finish, dict):
            raise BadRequest(400, "finish: SGLang's finish reason (an object) or null", "finish")
        stream = self._stream(body)
        with stream.lock:
            stream.ids += ids
            text = self.tokenizer.decode(stream.ids, skip_special_tokens=stream.adapted.sampling_params.get(
                "skip_special_tokens", True))
            if finish is not None:
                no_trim = bool(stream.adapted.sampling_params.get("no_stop_trim"))
                trimmed = self.trim(self.trim_self, list(stream.ids), finish, no_trim)
                text = self.tokenizer.decode(trimmed, skip_special_tokens=stream.adapted.sampling_params.get(
                    "skip_special_tokens", True))
                text = self.trim(self.trim_self, text, finish, no_trim)
            elif text.endswith("\ufffd"):
                text = stream.text  # a character still incomplete: held back, as SGLang's detokenizer does
            stream.text = text
            content = {"text": text, "output_ids": list(ids), "index": 0, "meta_info": {
                "id": stream.adapted.rid, "finish_reason": finish, "prompt_tokens": stream.prompt_tokens,
                "completion_tokens": len(stream.ids), "reasoning_tokens": 0, "cached_tokens": 0}}
            lines = self._run(self._step(stream, content, finish is not None))
        if finish is not None:
            with self.lock:
                self.streams.pop(stream.adapted.rid, None)
        chunks = []
        for line in lines:
            data = line.split("data: ", 1)[-1].strip()
            if data and data != "[DONE]":
                chunks.append(json.loads(data))
        return {"chunks": chunks}

    def resume(self, body: dict[str, Any]) -> dict[str, Any]:
        ids = output_ids(body)
        stream = self._stream(body)
        text = self.tokenizer.decode(ids, skip_special_tokens=False)
        params = stream.adapted.sampling_params
        grammar = params.get("structural_tag") is not None
        marks = self.markers
        if grammar and marks.TOOLS_OPEN in text:
            raise BadRequest(409, "the cut fell inside the tools section, and SGLang restarts the tool turn's "
                               "structural tag at a resumed request's first token")
        stops = params.get("stop") or []
        watched = [*([stops] if isinstance(stops, str) else stops)]
        if grammar:
            watched += [marks.TOOLS_OPEN, marks.THINK_CLOSE]
        for mark in watched:
            if any(text.endswith(mark[:n]) for n in range(1, len(mark))):
                raise BadRequest(409, f"the cut fell part way into {mark!r}, which the twin would not see whole")
        thinking = bool(stream.adapted.require_reasoning) and marks.THINK_CLOSE not in text
        return {"require_reasoning": thinking}

    # ---- state

    def _refused(self, params: dict[str, Any]) -> str | None:
        for name in ("json_schema", "regex", "ebnf", "stop_regex"):
            if params.get(name) is not None:
                return f"{name} (a constraint that restarts at a cut)"
        tag = params.get("structural_tag")
        if tag is not None and self.markers.TOOLS_OPEN not in str(tag):
            return "a structural tag other than the tool turn's"
        return None

    def _stream(self, body: dict[str, Any]) -> Stream:
        with self.lock:
            stream = self.streams.get(str(body.get("stream")))
        if stream is None:
            raise BadRequest(409, "no such stream here (this chat layer restarted, or the stream ended)")
        stream.used = time.monotonic()
        return stream

    def _reap(self) -> None:
        cutoff = time.monotonic() - IDLE_S
        with self.lock:
            for rid in [rid for rid, s in self.streams.items() if s.used < cutoff]:
                stale = self.streams.pop(rid)
                self.loop.call_soon_threadsafe(stale.feed.put_nowait, None)

    async def _start(self, stream: Stream) -> None:
        async def pump() -> None:
            try:
                async for line in self.route._generate_chat_stream(stream.adapted, stream.request, None):
                    stream.out.put_nowait(line)
            except Exception as exc:  # noqa: BLE001  # handed to the call waiting for this stream's lines
                stream.out.put_nowait(exc)
            stream.out.put_nowait(END)

        stream.pump = asyncio.ensure_future(pump())
        await self._until_waiting(stream)

    async def _step(self, stream: Stream, content: dict[str, Any], last: bool) -> list[str]:
        stream.feed.put_nowait(content)
        if last:
            stream.feed.put_nowait(None)
        return await self._until_waiting(stream)

    async def _until_waiting(self, stream: Stream) -> list[str]:
        lines: list[str] = []
        while True:
            item = await stream.out.get()
            if item in (NEED, END):
                return lines
            if isinstance(item, Exception):
                raise BadRequest(500, f"SGLang's chat stream failed: {type(item).__name__}: {item}")
            lines.append(item)


def output_ids(body: dict[str, Any]) -> list[int]:
    ids = body.get("output_ids") or []
    if not isinstance(ids, list) or not all(type(i) is int and 0 <= i < TOKEN_ID_END for i in ids):
        raise BadRequest(400, f"output_ids: a list of token ids (whole numbers from 0 below {TOKEN_ID_END})",
                         "output_ids")
    return ids


def invalid(exc: ValueError) -> BadRequest:
    """A 400 naming the field pydantic refused (its first error), or the error's first line."""
    errors = getattr(exc, "errors", None)
    if callable(errors) and errors():
        first = errors()[0]
        field = ".".join(str(part) for part in first.get("loc", ())) or None
        return BadRequest(400, f"{field}: {first.get('msg')}"[:500], field)
    return BadRequest(400, str(exc).splitlines()[0][:500])


def log(line: str) -> None:
    print(f"sglang-chat: {line}", file=sys.stderr, flush=True)


class Handler(intake.BoundedHandler):
    """One call of the resuming layer, bounded as the layer bounds its own clients (intake.py)."""

    layer: ChatLayer

    def do_GET(self) -> None:
        self.read_deadline.cancel()  # a GET has no body: all of it has come
        if self.path.split("?", 1)[0] == "/health":
            return self.whole(200, json.dumps({"streams": len(self.layer.streams)}).encode())
        self.last_word(404, "Not Found")

    def do_POST(self) -> None:
        route = self.path.split("?", 1)[0]
        calls = {"/v1/chat/completions/render": self.layer.render, "/v1/chat/completions/derender":
                 self.layer.derender, "/v1/chat/completions/resume": self.layer.resume}
        call = calls.get(route)
        try:
            if call is None:
                raise BadRequest(404, "Not Found")
            try:
                raw = self.body()
            except TimeoutError:
                log(f"a caller's body did not arrive within {self.server.client_timeout_s:g} s")
                raise BadRequest(408, f"the request body did not arrive within {self.server.client_timeout_s:g} s"
                                 ) from None
            except OSError:
                return  # the caller went away
            answer = json.dumps(call(request.parse(raw))).encode()
        except BadRequest as exc:
            return self.last_word(exc.status, exc.message, exc.param)
        except Exception as exc:  # noqa: BLE001  # one line and a 500, never a traceback to the caller
            log(f"{route}: {type(exc).__name__}: {str(exc)[:300]!r}")  # repr: a body's control characters escaped
            return self.last_word(500, f"the chat layer failed ({type(exc).__name__})")
        try:
            self.whole(200, answer)
        except OSError:  # gone, or read nothing for client_timeout_s: its answer is dropped, its thread ends
            log(f"a caller read nothing of its answer for {self.server.client_timeout_s:g} s")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m kimi_cluster.node.sglang_chat", description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--revision")
    ap.add_argument("--served-model-name", required=True)
    ap.add_argument("--trust-remote-code", action="store_true")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--client-timeout-s", type=float, default=intake.CLIENT_TIMEOUT_S,
                    help="a caller's whole request must arrive, and each write to it go through, within this "
                         "(408 / ended)")
    args = ap.parse_args(argv)
    if not 0 < args.client_timeout_s <= 3600:
        ap.error("--client-timeout-s must be more than 0 and at most 3600")
    layer = ChatLayer(args.model, args.served_model_name, args.revision, args.trust_remote_code)
    server = intake.BoundedServer((args.host, args.port), type("Bound", (Handler,), {"layer": layer}))
    server.max_body, server.client_timeout_s = MAX_BODY, args.client_timeout_s
    log(f"serving {args.served_model_name} on {args.host}:{args.port}")
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
