"""Serve a transformers causal LM through pfxcached: multi-turn chats that share a system prompt.

Starts a daemon sized for the model (page size, block bytes from
``pfxcache.client.hf.block_bytes_for``) unless ``--url`` names one, builds a
small Llama locally from a config with seeded random weights (no downloads;
``--model DIR`` loads any local model directory instead, offline), and plays
``--users`` chats of ``--turns`` turns. Every chat starts with the same system
prompt; each turn's prompt is the whole conversation so far (system prompt,
earlier user messages and answers) plus a new user message. Token ids are
drawn deterministically from ``--seed``.

Each turn runs twice: through the cache (``generate_with_cache``: look up,
load the cached pages, prefill only the rest, store the new pages, decode)
and without it (the whole prompt prefilled), greedy both times. The table
shows per turn and in total: the tokens reused from the cache, the hit rate,
the prefill time without the cache and with it (load of the cached pages +
prefill of the rest; storing the new pages is listed apart), and whether the
generated tokens are identical.

    scripts/demo                                  # 3 users x 3 turns, tiny random Llama
    scripts/demo --users 4 --turns 5 --system-tokens 1024
    scripts/demo --model ~/models/TinyLlama-1.1B --dtype bfloat16
    scripts/demo --url redis://127.0.0.1:6390/0   # a running daemon (its geometry must fit the model)
    scripts/demo --json                           # the figures as JSON
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


from pfxcache.tools.common import progress_bar, tool_parser

# The built-in model: big enough that prefill dominates its time, small enough for 2 CPU cores.
TINY = dict(vocab_size=2048, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
            num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=4096)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = tool_parser("demo", __doc__.split("\n\n")[0])
    parser.add_argument("--url", help="a running pfxcached (default: start one sized for the model)")
    parser.add_argument("--model", metavar="DIR", help="a local transformers model directory (from_pretrained, "
                        "offline) instead of the built-in random tiny Llama")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--users", type=int, default=3)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--system-tokens", type=int, default=384, help="tokens of the shared system prompt")
    parser.add_argument("--message-tokens", type=int, default=24, help="tokens of each user message")
    parser.add_argument("--answer-tokens", type=int, default=16, help="tokens generated per turn")
    parser.add_argument("--page-size", type=int, default=16, help="for the daemon the demo starts")
    parser.add_argument("--maxmemory", default="64mb", help="for the daemon the demo starts")
    parser.add_argument("--namespace", help="default: demo:<model>:<dtype>:<pid>")
    parser.add_argument("--seed", type=int, default=0, help="weights of the built-in model and the token ids")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1: steadier timings)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser.parse_args(argv)


def load_model(args: argparse.Namespace):
    import torch
    import transformers

    dtype = getattr(torch, args.dtype)
    if args.model:
        name = Path(args.model).name
        try:
            model = transformers.AutoModelForCausalLM.from_pretrained(args.model, local_files_only=True, dtype=dtype)
        except TypeError:  # transformers 4.x names it torch_dtype
            model = transformers.AutoModelForCausalLM.from_pretrained(args.model, local_files_only=True,
                                                                      torch_dtype=dtype)
    else:
        name = "tiny-llama"
        torch.manual_seed(args.seed)
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**TINY)).to(dtype)
    return name, model.eval()


def conversation_tokens(rng, vocab: int, n: int) -> list[int]:
    return rng.integers(3, vocab, n).tolist()  # ids 0..2 are usually special tokens


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    import numpy as np
    import torch

    from pfxcache.client import PrefixCache
    from pfxcache.client import hf

    torch.set_num_threads(args.threads)
    name, model = load_model(args)
    dtype = next(model.parameters()).dtype
    layout = hf.kv_layout(model.config, args.page_size, dtype)

    daemon = None
    if args.url:
        url = args.url
    else:
        from pfxcache.testing import start_daemon

        daemon = start_daemon("--page-size", str(args.page_size), "--block-bytes", str(layout.block_bytes),
                              "--maxmemory", args.maxmemory)
        url = f"redis://{daemon.host}:{daemon.port}/0"
    try:
        cache = PrefixCache.from_url(url)
        info = cache.info()
        layout = hf.kv_layout(model.config, info.page_size, dtype)
        namespace = args.namespace or f"demo:{name}:{args.dtype}:{os.getpid()}"
        vocab = model.config.get_text_config().vocab_size if hasattr(model.config, "get_text_config") \
            else model.config.vocab_size
        rng = np.random.default_rng(args.seed)
        system = conversation_tokens(rng, vocab, args.system_tokens)
        history = [list(system) for _ in range(args.users)]

        # Warm-up (first calls allocate and pick kernels): not measured.
        hf.generate_without_cache(model, conversation_tokens(rng, vocab, args.system_tokens), 2)

        rows = []
        total = args.users * args.turns
        bar = progress_bar(total, "turns", "turn", quiet=args.no_progress)
        for turn in range(1, args.turns + 1):
            for user in range(args.users):
                prompt = history[user] + conversation_tokens(rng, vocab, args.message_tokens)
                plain = hf.generate_without_cache(model, prompt, args.answer_tokens)
                cached = hf.generate_with_cache(model, cache, namespace, prompt, args.answer_tokens)
                history[user] = prompt + plain.tokens
                rows.append({
                    "user": user + 1, "turn": turn, "prompt_tokens": len(prompt),
                    "reused_tokens": cached.reused_tokens, "computed_tokens": cached.computed_tokens,
                    "hit_rate": cached.hit_rate, "stored_pages": cached.stored_pages,
                    "prefill_ms_without_cache": plain.prefill_seconds * 1e3,
                    "prefill_ms_with_cache": cached.time_to_first_token * 1e3,
                    "load_ms": cached.load_seconds * 1e3, "compute_ms": cached.prefill_seconds * 1e3,
                    "store_ms": cached.store_seconds * 1e3,
                    "identical": cached.tokens == plain.tokens,
                    "max_logit_diff": float((cached.prefill_logits - plain.prefill_logits).abs().max()),
                })
                bar.update(1)
        bar.close()
        if args.url:
            cache.evict(namespace, all=True)  # leave a shared daemon as it was
        via = cache.via
        cache.close()
    finally:
        if daemon is not None:
            daemon.stop()

    prompt_total = sum(r["prompt_tokens"] for r in rows)
    reused_total = sum(r["reused_tokens"] for r in rows)
    without = sum(r["prefill_ms_without_cache"] for r in rows)
    with_cache = sum(r["prefill_ms_with_cache"] for r in rows)
    totals = {
        "turns": len(rows), "prompt_tokens": prompt_total, "reused_tokens": reused_total,
        "computed_tokens": prompt_total - reused_total, "hit_rate": reused_total / prompt_total,
        "stored_pages": sum(r["stored_pages"] for r in rows),
        "prefill_ms_without_cache": without, "prefill_ms_with_cache": with_cache,
        "store_ms": sum(r["store_ms"] for r in rows),
        "speedup": without / with_cache if with_cache else None,
        "identical": all(r["identical"] for r in rows),
        "max_logit_diff": max(r["max_logit_diff"] for r in rows),
    }
    setup = {
        "model": name, "dtype": str(dtype).removeprefix("torch."), "layers": layout.layers,
        "kv_heads": layout.kv_heads, "head_dim": layout.head_dim, "page_size": layout.page_size,
        "block_bytes": layout.block_bytes, "daemon": url, "via": via, "threads": args.threads,
        "users": args.users, "turns": args.turns, "system_tokens": args.system_tokens,
        "message_tokens": args.message_tokens, "answer_tokens": args.answer_tokens,
    }
    if args.json:
        print(json.dumps({"setup": setup, "turns": rows, "total": totals}, indent=2))
    else:
        print_table(setup, rows, totals)
    return 0 if totals["identical"] else 1


def print_table(setup: dict, rows: list[dict], totals: dict) -> None:
    print(f"model {setup['model']} ({setup['dtype']}, {setup['layers']} layers, {setup['kv_heads']} kv heads x "
          f"{setup['head_dim']}), page {setup['page_size']} tokens = {setup['block_bytes']} bytes, "
          f"daemon {setup['daemon']} via {setup['via']}, {setup['threads']} torch thread(s)")
    print(f"{setup['users']} users x {setup['turns']} turns: system prompt {setup['system_tokens']} tokens, "
          f"messages {setup['message_tokens']}, answers {setup['answer_tokens']} (greedy)")
    print()
    header = (f"{'user':>4} {'turn':>4} {'prompt':>6} {'reused':>6} {'hit':>5} {'stored':>6} "
              f"{'prefill ms':>10} {'cached ms':>9} {'speedup':>7} {'store ms':>8}  identical")
    print(header)
    print("-" * len(header))
    for r in rows:
        speed = r["prefill_ms_without_cache"] / r["prefill_ms_with_cache"]
        print(f"{r['user']:>4} {r['turn']:>4} {r['prompt_tokens']:>6} {r['reused_tokens']:>6} "
              f"{r['hit_rate']:>5.0%} {r['stored_pages']:>6} {r['prefill_ms_without_cache']:>10.1f} "
              f"{r['prefill_ms_with_cache']:>9.1f} {speed:>6.1f}x {r['store_ms']:>8.1f}  "
              f"{'yes' if r['identical'] else 'NO'}")
    print("-" * len(header))
    t = totals
    print(f"{'total':>9} {t['prompt_tokens']:>6} {t['reused_tokens']:>6} {t['hit_rate']:>5.0%} "
          f"{t['stored_pages']:>6} {t['prefill_ms_without_cache']:>10.1f} {t['prefill_ms_with_cache']:>9.1f} "
          f"{t['speedup']:>6.1f}x {t['store_ms']:>8.1f}  {'yes' if t['identical'] else 'NO'}")
    print()
    print("prefill ms: the whole prompt without the cache; cached ms: lookup + load of the cached pages + "
          "prefill of the rest;")
    print(f"store ms: writing the new pages back (not in cached ms). Largest difference of the first "
          f"token's logits: {t['max_logit_diff']:.1e}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
