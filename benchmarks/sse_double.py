"""A TEST DOUBLE, not a server under study: a loopback OpenAI-style completions endpoint that
streams `max_tokens` chunks after a fixed TTFT at a fixed ITL, and records when it emitted
each chunk, so the client's own measurement error can be measured. Used only by
client_fidelity.py.

    python benchmarks/sse_double.py --port 0 --ttft-ms 50 --itl-ms 20 --emit-log FILE
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time

from aiohttp import web


def make_app(ttft_s: float, itl_s: float, emitted: list) -> web.Application:
    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        rid = request.headers.get("X-Request-Id", "?")
        n = int(body["max_tokens"])
        t_recv = time.perf_counter()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        times = []
        for i in range(n):
            # Absolute targets (not sleep(itl) in a loop) so the double's own lag does not add up.
            target = t_recv + ttft_s + i * itl_s
            await asyncio.sleep(max(0.0, target - time.perf_counter()))
            chunk = {"choices": [{"index": 0, "text": " w"}], "usage": {"prompt_tokens": 1, "completion_tokens": i + 1}}
            await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            times.append(time.perf_counter())
        await resp.write(b'data: {"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": %d}}\n\n' % n)
        await resp.write(b"data: [DONE]\n\n")
        emitted.append((rid, t_recv, times))
        return resp

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text="# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 0\n")

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/metrics", metrics)
    return app


async def serve(args) -> None:
    emitted: list = []
    runner = web.AppRunner(make_app(args.ttft_ms / 1000, args.itl_ms / 1000, emitted), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", args.port, backlog=4096)
    await site.start()
    print(site._server.sockets[0].getsockname()[1], flush=True)  # the port, for the caller
    try:
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until stdin closes
    finally:
        with open(args.emit_log, "w") as f:
            json.dump(emitted, f)
        await runner.cleanup()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--ttft-ms", type=float, default=50)
    p.add_argument("--itl-ms", type=float, default=20)
    p.add_argument("--emit-log", required=True)
    try:
        import uvloop  # the double must not be the bottleneck

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(serve(p.parse_args()))
