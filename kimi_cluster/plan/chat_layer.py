"""Which of the replicas' extraEngineArgs shape the chat layer, and what the front's render server does with them.

Behind a front that resumes streams (Settings.resumes_streams), a stream is rendered (chat template, tokenizer,
multimodal inputs, default sampling parameters) and derendered (the client's chunks) by vLLM's render server on the
front, not by the replica's own `vllm serve` (kimi_cluster/plan/resume.py). Whatever shapes that layer on the replicas
must shape it there too, or a stream is rendered and sampled otherwise than a request that is not streamed.

`vllm launch render` takes `vllm serve`'s parser (vLLM 0.33.0, vllm/entrypoints/cli/launch.py) and builds its
ModelConfig from the same engine arguments (vllm/entrypoints/launchers/render/entry.py), so the model-config flags
below act on it as on the replicas; of the frontend flags it reads only those its renderer and derenderer take
(vllm/entrypoints/launchers/render/app_state.py). RENDER_FLAGS are handed to it with the same values. UNRENDERABLE
names what it cannot do as the replicas do, refused while streams resume: the response flags `vllm serve`'s chat
serving reads (vllm/entrypoints/openai/chat_completion/serving.py) and the derenderer never does
(the render server's app state, above, takes none of them), and a local media folder, which lives on the GPU nodes
and not on the front.
"""

from __future__ import annotations

from collections.abc import Sequence

from kimi_cluster.plan.launch import flag_name
from kimi_cluster.settings import NAMESPACE, shown

# Flags of vLLM 0.33.0's serve parser that shape rendering, parsing or the default sampling parameters, and that
# the render server honours (tests/engine_parsers check each against vLLM's own parser).
RENDER_FLAGS = (
    # The chat template and how it is applied (OnlineRenderer / OnlineDerenderer).
    "--chat-template", "--chat-template-content-format", "--default-chat-template-kwargs",
    "--trust-request-chat-template", "--trust-request-mm-kwargs", "--exclude-tools-when-tool-choice-none",
    "--tool-strict-level", "--reasoning-effort-map", "--anthropic-disabled-thinking-effort",
    # The tokenizer and the model's config (ModelConfig).
    "--tokenizer", "--tokenizer-mode", "--tokenizer-revision", "--hf-overrides", "--hf-config-path",
    "--config-format", "--code-revision",
    # Default sampling parameters (ModelConfig.get_diff_sampling_param, read by the render route) and the logprob
    # limit the derenderer checks.
    "--generation-config", "--override-generation-config", "--max-logprobs",
    # Multimodal inputs, processed (and image URLs fetched) by the render server.
    "--limit-mm-per-prompt", "--mm-processor-kwargs", "--media-io-kwargs", "--allowed-media-domains",
)
# Flags that shape what a replica answers and that the render server cannot reproduce, with the reason.
_NOT_READ = "vLLM's render server, which answers the streams, never reads it"
UNRENDERABLE = {
    "--response-role": _NOT_READ,
    "--return-tokens-as-token-ids": _NOT_READ,
    "--enable-prompt-tokens-details": _NOT_READ,
    "--enable-force-include-usage": _NOT_READ,
    "--allowed-local-media-path": "the render server reads images on the front, which has none of the GPU nodes' "
                                  "files",
}


# SGLang 0.5.23's flags that shape its chat route (sglang/srt/entrypoints/openai/serving_chat.py reads the tokenizer,
# the template manager's chat template, the model config's overrides and default sampling parameters, and the grammar
# backend; fields in sglang/srt/arg_groups/fields/serving.py, model.py, exec_.py). The front's chat layer
# (kimi_cluster/node/sglang_chat.py) takes none of them, so while streams resume they are refused, not ignored.
SGLANG_CHAT_FLAGS = ("--tokenizer-path", "--tokenizer-mode", "--chat-template", "--json-model-override-args",
                     "--sampling-defaults", "--grammar-backend")


def _known(flag: str, names: tuple[str, ...]) -> str | None:
    """`flag` as one of `names`: itself, its --no- negation, or (argparse's abbreviations) an unambiguous prefix."""
    flag = "--" + flag[len("--no-"):] if flag.startswith("--no-") else flag
    if flag in names:
        return flag
    hits = [n for n in names if len(flag) > 3 and n.startswith(flag)]
    return hits[0] if len(hits) == 1 else None


def flag_groups(args: Sequence[str]) -> list[tuple[str, list[str]]]:
    """extraEngineArgs as (flag, its words: the flag and the values that follow it), in order."""
    groups: list[tuple[str, list[str]]] = []
    for arg in args:
        flag = flag_name(arg)
        if flag is not None:
            groups.append((flag, [arg]))
        elif groups:
            groups[-1][1].append(arg)
    return groups


def render_args(extra_engine_args: Sequence[str]) -> list[str]:
    """The replicas' extraEngineArgs that the render server takes, word for word, in their order."""
    return [word for flag, words in flag_groups(extra_engine_args) if _known(flag, RENDER_FLAGS)
            for word in words]


def chat_layer_problems(resumes_streams: bool, extra_engine_args: Sequence[str],
                        engine_name: str = "vllm") -> list[str]:
    """Every extraEngineArgs flag the front's chat layer cannot take while streams resume, naming it and why."""
    if not resumes_streams:
        return []
    if engine_name == "sglang":
        return [f"{NAMESPACE}:extraEngineArgs sets {hit} ({shown(' '.join(words))}), which shapes SGLang's chat "
                "route and which the front's chat layer does not take while streams resume: streams would answer "
                f"otherwise than the replicas; drop it, or set {NAMESPACE}:resumeStreams to false"
                for flag, words in flag_groups(extra_engine_args)
                if (hit := None if flag.startswith("--no-") else _known(flag, SGLANG_CHAT_FLAGS))]
    problems = []
    for flag, words in flag_groups(extra_engine_args):
        # A --no- spelling keeps the replicas at vLLM's default, which is the render server's too.
        hit = None if flag.startswith("--no-") else _known(flag, tuple(UNRENDERABLE))
        if hit:
            problems.append(f"{NAMESPACE}:extraEngineArgs sets {hit} ({shown(' '.join(words))}), which the front's "
                            f"render server cannot follow while streams resume ({UNRENDERABLE[hit]}): streams "
                            f"would answer otherwise than the replicas; drop it, or set {NAMESPACE}:resumeStreams "
                            "to false")
    return problems
