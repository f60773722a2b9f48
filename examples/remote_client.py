"""A program on a `pawfn serve` (or Ray Serve) server, through the typed `Remote` backend: the same API as a
local program, the interpreter checked against the server's before any call.

    pawfn serve --program triage=triage.paw --base qwen3-0.6b-q6_k.gguf --api-key-env PAWFN_KEY &
    python examples/remote_client.py --server http://127.0.0.1:8000 --program triage --key-env PAWFN_KEY \\
        --input "Server down!" --input "Lunch?"
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

from pawfn import PawConfig, PawError, PawFn, Qwen3_0_6B, Remote, RuntimeOptions


async def concurrently(program: PawFn[Qwen3_0_6B, Remote], inputs: list[str], options: RuntimeOptions) -> list[str]:
    """One request per input, all in flight at once (the server decodes them together)."""
    return list(await asyncio.gather(*(program.arun(text, options) for text in inputs)))


def main() -> int:
    parser = argparse.ArgumentParser(description="Call a served Qwen3 program through the Remote backend.")
    parser.add_argument("--server", required=True, help="the server's root URL, e.g. http://127.0.0.1:8000")
    parser.add_argument("--program", required=True, help="the program's name on the server: id, slug or NAME")
    parser.add_argument("--key-env", help="environment variable that holds the server's API key")
    parser.add_argument("--input", action="append", required=True, help="input text (repeatable)")
    parser.add_argument("--max-tokens", type=int, default=16)
    args = parser.parse_args()
    key = os.environ.get(args.key_env) if args.key_env else None
    options = RuntimeOptions(max_tokens=args.max_tokens)
    try:
        config = PawConfig.from_env(server_url=args.server, server_api_key=key)
        with PawFn[Qwen3_0_6B, Remote].load_sync(args.program, config=config) as program:
            print(f"{program.program_id or args.program} on {args.server}: {program.interpreter}, {program.prefix_tokens}-token prefix")
            batch = program.run_batch(args.input, options)  # one request
            for text, output in zip(args.input, batch, strict=True):
                print(f"{text!r} -> {output!r}")
            assert asyncio.run(concurrently(program, args.input, options)) == batch  # greedy: the same answers
    except PawError as exc:
        print(f"remote_client: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
