"""A tiny model folder in Kimi K3's chat format, that vLLM's real render server serves on a CPU: its config, a
byte-level tokenizer with K3's XTML marker tokens, and a chat template of this project's own in K3's shape.

It stands in for the checkpoint's own tokenizer and template where the sandbox needs the engine's chat layer (the
front's render server, kimi_cluster/plan/resume.py): vLLM's Kimi K3 reasoning and tool-call parsers (vLLM 0.33.0,
vllm/reasoning/kimi_k3_reasoning_parser.py, vllm/tool_parsers/kimi_k3_tool_parser.py) read the markers
`<|open|>`, `<|close|>` and `<|sep|>` as tokens of their own and everything else as text, so a tokenizer whose every
other token is one byte round-trips any text exactly (token id == byte value) and needs no merges. The fake engine
(kimi_cluster/fakes/inference/generate.py) encodes and decodes with `encode` and `decode` here, without any tokenizer
library; the fake hub serves `files()` beside the weights.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jinja2.sandbox

SPECIALS = ("<|open|>", "<|close|>", "<|sep|>", "[BOS]", "[EOS]")
SPECIAL_IDS = {text: 256 + i for i, text in enumerate(SPECIALS)}
EOS_ID = SPECIAL_IDS["[EOS]"]
VOCAB_SIZE = 256 + len(SPECIALS)
_SPLIT = re.compile("(" + "|".join(re.escape(s) for s in SPECIALS) + ")")

# The chat template: K3's XTML elements, written for this fake. System and user text, the tools on offer as JSON, an
# assistant turn's think, response and tools channels (each call `<|open|>call tool="NAME" index="N" id="ID"<|sep|>`
# with its arguments as JSON), tool results by call id; the effort the request names (vLLM hands the template
# `reasoning_effort`), before the generation prompt, which opens an assistant turn; the model opens its own think
# channel.
CHAT_TEMPLATE = (
    "{%- for m in messages -%}"
    "{%- set text = m['content'] if m['content'] is string else "
    "(m['content'] or []) | selectattr('type', 'equalto', 'text') | map(attribute='text') | join(' ') -%}"
    "{%- if m['role'] == 'assistant' -%}"
    "<|open|>assistant<|sep|>"
    "{%- set thought = m.get('reasoning') or m.get('reasoning_content') -%}"
    "{%- if thought -%}<|open|>think<|sep|>{{ thought }}<|close|>think<|sep|>{%- endif -%}"
    "{%- if text -%}<|open|>response<|sep|>{{ text }}<|close|>response<|sep|>{%- endif -%}"
    "{%- if m.get('tool_calls') -%}<|open|>tools<|sep|>"
    "{%- for c in m['tool_calls'] -%}"
    "<|open|>call tool=\"{{ c['function']['name'] }}\" index=\"{{ loop.index }}\" id=\"{{ c['id'] }}\"<|sep|>"
    "{{ c['function']['arguments'] if c['function']['arguments'] is string else c['function']['arguments'] | tojson }}"
    "<|close|>call<|sep|>"
    "{%- endfor -%}<|close|>tools<|sep|>{%- endif -%}"
    "<|close|>assistant<|sep|>"
    "{%- elif m['role'] == 'tool' -%}"
    "<|open|>tool id=\"{{ m['tool_call_id'] }}\"<|sep|>{{ text }}<|close|>tool<|sep|>"
    "{%- else -%}"
    "<|open|>{{ m['role'] }}<|sep|>{{ text }}<|close|>{{ m['role'] }}<|sep|>"
    "{%- endif -%}"
    "{%- if loop.first and tools -%}<|open|>declare<|sep|>{{ tools | tojson }}<|close|>declare<|sep|>{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{%- if reasoning_effort -%}<|open|>effort<|sep|>{{ reasoning_effort }}<|close|>effort<|sep|>{%- endif -%}"
    "<|open|>assistant<|sep|>"
    "{%- endif -%}"
)
GENERATION_PROMPT = "<|open|>assistant<|sep|>"


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's map of each byte to a printable character, the alphabet of Hugging Face's byte-level tokenizers."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, chars, strict=True)}


def encode(text: str) -> list[int]:
    """Token ids: each marker its own id, every other byte its value."""
    ids: list[int] = []
    for part in _SPLIT.split(text):
        if part in SPECIAL_IDS:
            ids.append(SPECIAL_IDS[part])
        elif part:
            ids.extend(part.encode("utf-8"))
    return ids


def decode(ids: list[int]) -> str:
    """The text of token ids (markers as their text; bytes that are not whole UTF-8 replaced)."""
    out, pending = [], bytearray()
    for i in ids:
        if i < 256:
            pending.append(i)
            continue
        out.append(pending.decode("utf-8", "replace"))
        pending.clear()
        out.append(SPECIALS[i - 256])
    out.append(pending.decode("utf-8", "replace"))
    return "".join(out)


def render(messages: Sequence[Mapping[str, Any]] | Sequence[Any], tools: list | None = None,
           reasoning_effort: str | None = None) -> str:
    """The prompt the chat template makes of a conversation, with the generation prompt (jinja2, as Hugging Face's
    apply_chat_template runs it, for the fake engines' tokenize routes)."""
    env = jinja2.sandbox.ImmutableSandboxedEnvironment()
    # Hugging Face's own tojson (transformers' chat template utils): no HTML escaping, keys in their order.
    env.filters["tojson"] = lambda value, indent=None, separators=None, sort_keys=False: json.dumps(
        value, ensure_ascii=False, indent=indent, separators=separators, sort_keys=sort_keys)
    template = env.from_string(CHAT_TEMPLATE)
    return template.render(messages=messages, tools=tools, reasoning_effort=reasoning_effort,
                           add_generation_prompt=True)


def tokenizer_json() -> dict:
    """A Hugging Face fast tokenizer: byte-level BPE with no merges, the markers as special added tokens."""
    vocab = {char: b for b, char in _bytes_to_unicode().items()}
    added = [{"id": SPECIAL_IDS[s], "content": s, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for s in SPECIALS]
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                              "use_regex": False},
            "post_processor": None,
            "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False},
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                      "ignore_merges": False, "vocab": vocab, "merges": []}}


def files(max_len: int = 65536) -> dict[str, bytes]:
    """The model folder's files: a one-layer Llama-shaped config (the render server loads no weight), the
    tokenizer and its config with the chat template."""
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
              "intermediate_size": 128, "num_attention_heads": 2, "num_key_value_heads": 2, "num_hidden_layers": 1,
              "vocab_size": VOCAB_SIZE, "max_position_embeddings": max_len, "bos_token_id": SPECIAL_IDS["[BOS]"],
              "eos_token_id": EOS_ID, "torch_dtype": "float32"}
    tokenizer_config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "[BOS]", "eos_token": "[EOS]",
                        "model_max_length": max_len, "chat_template": CHAT_TEMPLATE}
    return {"config.json": json.dumps(config, indent=2).encode(),
            "tokenizer.json": json.dumps(tokenizer_json(), ensure_ascii=False).encode(),
            "tokenizer_config.json": json.dumps(tokenizer_config, indent=2).encode()}


def write_model(folder: Path, max_len: int = 65536) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in files(max_len).items():
        (folder / name).write_bytes(data)
    return folder
