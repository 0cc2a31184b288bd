"""``python -m pfxcache.client.vllm MODEL_DIR [--block-size N] [--dtype D]``: the daemon directives a model needs."""

from __future__ import annotations

import argparse
import sys

from .layout import base_namespace, geometry_for_model


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pfxcache.client.vllm",
                                     description="Print the --page-size and --block-bytes a pfxcache daemon needs "
                                                 "to serve a model's KV to vLLM.")
    parser.add_argument("model", help="the model directory (or its config.json)")
    parser.add_argument("--block-size", type=int, default=16, help="vLLM's block_size (default 16; the CPU build "
                                                                   "needs a multiple of 32)")
    parser.add_argument("--dtype", default=None, help="the dtype vLLM runs the model in (default: the config's)")
    args = parser.parse_args(argv)
    try:
        geometry = geometry_for_model(args.model, args.block_size, args.dtype)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(geometry.daemon_args())
    print(f"# {geometry.describe()}; namespace {base_namespace(args.model, geometry.dtype, args.block_size)}",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
