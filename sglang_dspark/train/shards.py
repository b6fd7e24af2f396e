"""Training data on disk: a dataset directory of shards, written resumably, read memory-mapped.

A dataset directory holds
  dataset.json        settings, stored layers, one entry per finished shard, records consumed
  final_norm.pt       the target's final RMSNorm (weight, eps): the final normed hidden state is
                      recomputed from the stored last-layer output, exactly as the log-normaliser was
  shard-00000.pt ...  one torch.save per shard:
      tokens       int32 [sum n]        prompt + response of every sequence, concatenated
      offsets      int64 [S + 1]        sequence s is tokens[offsets[s] : offsets[s + 1]]
      prompt_lens  int32 [S]
      features     fp16  [sum (n - 1), L * H]  outputs of the stored target layers at positions
                                        0..n-2 (the last token is only ever a label)
      lse          fp32  [sum (n - 1)]  log-sum-exp of the target's logits at those positions
      argmax       int32 [sum (n - 1)]  the target's most likely next token there
      ids, domains list[str]            source record id and domain per sequence
      mass         fp64  [V]            sum of the target's next-token probabilities over the
                                        response positions (what a hot vocabulary must cover)

Features of sequence s start at row offsets[s] - s. Shards are loaded with mmap, so a dataset far
larger than memory is read page by page as batches touch it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch

MANIFEST = "dataset.json"
FINAL_NORM = "final_norm.pt"
FORMAT = 1


@dataclass
class Sequence:
    """One sequence as training reads it."""

    tokens: torch.Tensor  # int64 [n]
    prompt_len: int
    features: torch.Tensor  # fp16 [n - 1, L * H], all stored layers
    lse: torch.Tensor  # fp32 [n - 1]
    argmax: torch.Tensor  # int64 [n - 1]
    domain: str
    # True when the response is the target's own sample (on-policy); False for text the target only
    # prefilled, whose tokens are then no sample of the target (training labels use its argmax)
    target_sampled: bool = True


def atomic_save(obj, path: Path) -> None:
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)  # a reader never sees a half-written file


def pack_shard(rows: list[dict], vocab_size: int) -> dict:
    """Rows {"tokens", "prompt_len", "features", "lse", "argmax", "mass", "id", "domain"} -> a shard."""
    lengths = torch.tensor([len(r["tokens"]) for r in rows], dtype=torch.int64)
    offsets = torch.zeros(len(rows) + 1, dtype=torch.int64)
    offsets[1:] = lengths.cumsum(0)
    mass = torch.zeros(vocab_size, dtype=torch.float64)
    for r in rows:
        mass += r["mass"]
    return {
        "tokens": torch.cat([torch.as_tensor(r["tokens"], dtype=torch.int32) for r in rows]),
        "offsets": offsets,
        "prompt_lens": torch.tensor([r["prompt_len"] for r in rows], dtype=torch.int32),
        "features": torch.cat([r["features"].half() for r in rows]),
        "lse": torch.cat([r["lse"].float() for r in rows]),
        "argmax": torch.cat([r["argmax"].to(torch.int32) for r in rows]),
        "ids": [r["id"] for r in rows],
        "domains": [r["domain"] for r in rows],
        "mass": mass,
    }


class DatasetWriter:
    """Appends shards to a dataset directory; reopening it continues where the last shard ended."""

    def __init__(self, root, settings: dict, layer_ids: list[int], final_norm: dict):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.root / MANIFEST
        if path.is_file():
            self.manifest = json.loads(path.read_text())
            if self.manifest["settings"] != settings or self.manifest["layer_ids"] != list(layer_ids):
                raise ValueError(f"{self.root} holds a dataset built with other settings; use another --out")
        else:
            self.manifest = {"format": FORMAT, "settings": settings, "layer_ids": list(layer_ids),
                             "records_done": 0, "shards": []}
            torch.save(final_norm, self.root / FINAL_NORM)

    @property
    def records_done(self) -> int:
        """Source records consumed so far (kept or skipped): where a resumed build starts."""
        return self.manifest["records_done"]

    def add(self, rows: list[dict], records_consumed: int, vocab_size: int, cpu_s: float, wall_s: float) -> None:
        name = f"shard-{len(self.manifest['shards']):05d}.pt"
        if rows:
            atomic_save(pack_shard(rows, vocab_size), self.root / name)
        self.manifest["shards"].append({
            "file": name if rows else None, "sequences": len(rows),
            "tokens": int(sum(len(r["tokens"]) for r in rows)),
            "response_tokens": int(sum(len(r["tokens"]) - r["prompt_len"] for r in rows)),
            "cpu_s": round(cpu_s, 2), "wall_s": round(wall_s, 2)})
        self.manifest["records_done"] += records_consumed
        tmp = self.root / (MANIFEST + ".tmp")
        tmp.write_text(json.dumps(self.manifest, indent=1))
        os.replace(tmp, self.root / MANIFEST)

    def totals(self) -> dict:
        return dataset_totals(self.manifest)


def dataset_totals(manifest: dict) -> dict:
    shards = manifest["shards"]
    return {k: sum(s[k] for s in shards) for k in ("sequences", "tokens", "response_tokens", "cpu_s", "wall_s")}


def read_manifest(root) -> dict:
    path = Path(root) / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"{root}: no {MANIFEST} (build one with python -m sglang_dspark.train.build_data)")
    return json.loads(path.read_text())


class SequenceStore:
    """Every sequence of one or more dataset directories, by index, memory-mapped.

    `max_tokens` keeps only the first shards until that many tokens (equal-data comparisons)."""

    def __init__(self, roots, max_tokens: int | None = None):
        roots = [roots] if isinstance(roots, (str, os.PathLike)) else list(roots)
        self.roots = [Path(r) for r in roots]
        self.shards: list[dict] = []
        self.sampled: list[bool] = []  # per shard: responses are the target's own samples
        self.index: list[tuple[int, int]] = []  # (shard, sequence in shard)
        layer_sets, tokens = set(), 0
        for root in self.roots:
            manifest = read_manifest(root)
            layer_sets.add(tuple(manifest["layer_ids"]))
            for entry in manifest["shards"]:
                if entry["file"] is None or (max_tokens is not None and tokens >= max_tokens):
                    continue
                shard = torch.load(root / entry["file"], mmap=True, weights_only=True)
                self.index += [(len(self.shards), s) for s in range(len(shard["prompt_lens"]))]
                self.shards.append(shard)
                self.sampled.append(manifest["settings"]["source"] in ("on-policy", "sequences"))
                tokens += entry["tokens"]
        if len(layer_sets) != 1:
            raise ValueError(f"datasets store different target layers: {sorted(layer_sets)}")
        self.layer_ids = list(layer_sets.pop())
        self.final_norm = torch.load(self.roots[0] / FINAL_NORM, weights_only=True)
        self.num_tokens = tokens

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i: int) -> Sequence:
        shard_index, s = self.index[i]
        shard = self.shards[shard_index]
        lo, hi = int(shard["offsets"][s]), int(shard["offsets"][s + 1])
        flo, fhi = lo - s, hi - s - 1
        return Sequence(tokens=shard["tokens"][lo:hi].long(), prompt_len=int(shard["prompt_lens"][s]),
                        features=shard["features"][flo:fhi], lse=shard["lse"][flo:fhi],
                        argmax=shard["argmax"][flo:fhi].long(), domain=shard["domains"][s],
                        target_sampled=self.sampled[shard_index])

    def mass(self) -> torch.Tensor:
        """The target's summed next-token probabilities over every response position."""
        return sum(shard["mass"] for shard in self.shards)
