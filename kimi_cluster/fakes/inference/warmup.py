"""The kernel warm-up of a real engine's start: kernels missing from the cache compile (slowly), present ones
load."""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import threading
from collections.abc import Sequence

# Flags that decide which kernels a real engine compiles (the same idea as kimi_cluster/plan/kernel_cache.py).
_SHAPE_FLAGS = ("--ep-size", "--moe-runner-backend", "--quantization", "--kv-cache-dtype", "--attention-backend",
                "--dtype", "--enable-expert-parallel", "--data-parallel-size", "--decode-context-parallel-size",
                "--mm-encoder-tp-mode", "--moe-backend")


def kernel_files(engine: str, args: argparse.Namespace, ignored: Sequence[str], env: dict[str, str]) -> list[str]:
    """The files a warm-up leaves, in the folders the engine's environment names; none without those variables.

    SGLang sets DG_JIT_CACHE_DIR from SGLANG_DG_CACHE_DIR (default ~/.cache/sglang/deep_gemm) whatever the
    environment says; vLLM keeps its torch.compile artifacts under VLLM_CACHE_ROOT.
    """
    shape = [engine, f"tp={args.tp}", f"len={args.context_length or args.max_model_len}"]
    words = list(ignored)
    for i, word in enumerate(words):
        name = word.partition("=")[0]
        if name in _SHAPE_FLAGS:
            value = word.partition("=")[2] or (words[i + 1] if i + 1 < len(words) else "")
            shape.append(f"{name}={value}")
    h = hashlib.sha256(" ".join(shape).encode()).hexdigest()[:16]
    out = []
    if env.get("TRITON_CACHE_DIR"):
        out += [f"{env['TRITON_CACHE_DIR']}/{h}moe/fused_moe_kernel.cubin",
                f"{env['TRITON_CACHE_DIR']}/{h}moe/fused_moe_kernel.json",
                f"{env['TRITON_CACHE_DIR']}/{h}att/decode_attention_fwd.cubin"]
    if env.get("TORCHINDUCTOR_CACHE_DIR"):
        out.append(f"{env['TORCHINDUCTOR_CACHE_DIR']}/fxgraph/{h[:2]}/f{h}/graph")
    if engine == "sglang":
        dg = env.get("SGLANG_DG_CACHE_DIR") or (f"{env['XDG_CACHE_HOME']}/sglang/deep_gemm"
                                                 if env.get("XDG_CACHE_HOME") else "")
    else:
        dg = env.get("DG_JIT_CACHE_DIR", "")
    if dg:
        out.append(f"{dg}/cache/kernel.fp8_gemm.{h}/kernel.cubin")
    if engine == "vllm" and env.get("VLLM_CACHE_ROOT"):
        out.append(f"{env['VLLM_CACHE_ROOT']}/torch_compile_cache/{h}/rank_0_0/backbone/artifact")
    if engine == "tokenspeed":
        # tokenspeed-kernel 0.1.4: ops/tuning.py (<root>/<digest>/autotune_configs.json), thirdparty/msa/jit.py
        if env.get("TOKENSPEED_FLASHINFER_AUTOTUNE_CACHE_DIR"):
            out.append(f"{env['TOKENSPEED_FLASHINFER_AUTOTUNE_CACHE_DIR']}/{h[:24]}/autotune_configs.json")
        if env.get("MINFER_FMHA_CACHE_DIR"):
            out.append(f"{env['MINFER_FMHA_CACHE_DIR']}/{h}/fmha_kernel.so")
    return out


def warm_up(engine: str, args: argparse.Namespace, ignored: Sequence[str], env: dict[str, str],
            compile_seconds: float, stop: threading.Event) -> None:
    """As a real engine's start: kernels missing from the cache are compiled (slowly), present ones are loaded."""
    files = kernel_files(engine, args, ignored, env)
    if not files:
        return
    missing = [f for f in files if not os.path.exists(f)]
    if not missing:
        print(f"fake-inference: all {len(files)} kernels found in the cache; no compile", file=sys.stderr,
              flush=True)
        return
    seconds = compile_seconds * len(missing) / len(files)
    weights = "random weights (--load-format dummy)" if args.load_format == "dummy" else "the checkpoint"
    print(f"fake-inference: compiling {len(missing)} of {len(files)} kernels ({seconds:.1f} s; the cache had "
          f"{len(files) - len(missing)}) on {weights}", file=sys.stderr, flush=True)
    if stop.wait(seconds):
        # Stopped mid-compile, as `docker rm -f` stops a warm-up: nothing half-built is left in the cache.
        print("fake-inference: stopped while compiling; nothing written", file=sys.stderr, flush=True)
        return
    for path in missing:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        seed = hashlib.sha256(os.path.basename(path).encode()).digest()
        with open(path + ".tmp", "wb") as fh:
            fh.write(b"\x7fELF fake kernel " + seed * 256)
        os.replace(path + ".tmp", path)
    print(f"fake-inference: compiled {len(missing)} kernels", file=sys.stderr, flush=True)
