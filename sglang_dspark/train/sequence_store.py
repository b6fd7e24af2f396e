"""A directory of token sequences (what `self_distill` writes and `build_data --source sequences`
reads): small compressed shards that are committed with the repository, appended resumably.

The directory holds
  sequences.json      settings, one entry per finished shard (records, sequences, tokens, seconds)
  seq-00000.npz ...   tokens int32 [sum n] (prompt + reply, the end-of-turn token closing a reply
                      that ended), offsets int64 [S + 1], prompt_lens int32 [S], temperatures
                      float32 [S], ids and domains (str [S])
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

MANIFEST = "sequences.json"
FORMAT = 1


class SequenceWriter:
    """A sequence directory: its manifest and shards, appended resumably."""

    def __init__(self, out: str | os.PathLike, settings: dict):
        self.dir = Path(out)
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self.dir / MANIFEST
        if path.exists():
            self.manifest = json.loads(path.read_text())
            if self.manifest["settings"] != settings:
                raise ValueError(f"{path}: built with other settings {self.manifest['settings']}; "
                                 f"use another --out or the same options")
        else:
            self.manifest = {"format": FORMAT, "settings": settings, "shards": []}

    @property
    def records_done(self) -> int:
        return sum(s["records"] for s in self.manifest["shards"])

    def totals(self) -> dict:
        shards = self.manifest["shards"]
        return {k: sum(s[k] for s in shards) for k in ("records", "sequences", "tokens", "reply_tokens", "wall_s")}

    def add(self, seqs: list[dict], records: int, wall_s: float) -> None:
        index = len(self.manifest["shards"])
        name = f"seq-{index:05d}.npz"
        lengths = np.array([len(s["tokens"]) for s in seqs], dtype=np.int64)
        arrays = {
            "tokens": np.concatenate([np.asarray(s["tokens"], dtype=np.int32) for s in seqs]) if seqs
            else np.zeros(0, np.int32),
            "offsets": np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
            "prompt_lens": np.array([s["prompt_len"] for s in seqs], dtype=np.int32),
            "temperatures": np.array([s["temperature"] for s in seqs], dtype=np.float32),
            "ids": np.array([s["id"] for s in seqs], dtype=str),
            "domains": np.array([s["domain"] for s in seqs], dtype=str),
        }
        tmp = self.dir / f".{name}.{os.getpid()}.tmp.npz"
        np.savez_compressed(tmp, **arrays)
        os.replace(tmp, self.dir / name)  # a shard is on disk whole before the manifest names it
        self.manifest["shards"].append({
            "file": name, "records": records, "sequences": len(seqs), "tokens": int(lengths.sum()),
            "reply_tokens": int(sum(len(s["tokens"]) - s["prompt_len"] for s in seqs)), "wall_s": round(wall_s, 1)})
        tmp = self.dir / f".{MANIFEST}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(self.manifest, indent=1) + "\n")
        os.replace(tmp, self.dir / MANIFEST)


def read_sequences(directory: str | os.PathLike):
    """Yield (tokens int64 list, prompt_len, temperature, id, domain) of every stored sequence."""
    directory = Path(directory)
    manifest = json.loads((directory / MANIFEST).read_text())
    for shard in manifest["shards"]:
        with np.load(directory / shard["file"]) as z:
            tokens, offsets = z["tokens"], z["offsets"]
            for s in range(len(z["prompt_lens"])):
                yield (tokens[offsets[s]: offsets[s + 1]].astype(np.int64).tolist(), int(z["prompt_lens"][s]),
                       float(z["temperatures"][s]), str(z["ids"][s]), str(z["domains"][s]))
