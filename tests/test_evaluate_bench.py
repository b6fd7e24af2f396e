"""`evaluate --bench`: tau per category and bench in the paper's table form, with the speedup a
profile's SPS table predicts from the measured acceptance."""

import json

import pytest
import yaml

from drafter_fixtures import write_tiny_model_dirs
from sglang_dspark.core.sps import SpsTable
from sglang_dspark.evaluate import main, speedup_curve, with_speedup


def test_speedup_curve_prices_each_draft_count_on_the_table():
    sps = SpsTable.from_points([1, 2, 3], [10.0, 8.0, 5.0], max_batch_tokens=8)  # drafted = undrafted here
    curve = speedup_curve([0.5, 0.25], sps)
    assert curve == pytest.approx([1.0, 1.5 * 10 / 8 * 8 / 10 * 8 / 10, 1.75 * 5 / 10])
    summary = with_speedup({"tau": 1.75, "accept_rate_per_position": [0.5, 0.25]}, sps)
    assert summary["speedup_full"] == pytest.approx(curve[-1]) and summary["best_k"] == 1
    assert with_speedup({"tau": 1.0}, None) == {"tau": 1.0}


def test_cli_reports_categories_benches_speedup_and_markdown(tmp_path, capsys):
    target, draft = write_tiny_model_dirs(tmp_path)
    bench = tmp_path / "bench.jsonl"
    bench.write_text("\n".join(json.dumps({"domain": d, "prompt": p}) for d, p in
                               [("writing", "w5 w9"), ("math", "w7 w21 w4"), ("writing", "w30")]) + "\n")
    calib = tmp_path / "calib.jsonl"
    calib.write_text("\n".join(json.dumps({"domain": "c", "prompt": f"w{i} w{i + 3}"}) for i in range(5, 15)) + "\n")
    profile = tmp_path / "profile.yaml"
    profile.write_text(yaml.safe_dump({"sps": {"cost": {"sample_batch_tokens": [1, 4, 8],
                                                        "sample_steps_per_sec": [20.0, 15.0, 10.0],
                                                        "max_batch_tokens": 16}}}))
    out, md, sts = tmp_path / "r.json", tmp_path / "r.md", tmp_path / "sts.json"
    assert main(["--target", target, "--draft", draft, "--bench", str(bench), "--calibration-file", str(calib),
                 "--max-new-tokens", "12", "--profile", str(profile), "--out", str(out), "--markdown", str(md),
                 "--sts-out", str(sts)]) == 0
    report = json.loads(out.read_text())
    entry = report["by_temperature"]["0"]["benches"][str(bench)]
    assert set(entry["categories"]) == {"writing", "math"}
    assert entry["macro_tau"] == pytest.approx((entry["categories"]["writing"]["tau"] + entry["categories"]["math"]["tau"]) / 2)
    for c in entry["categories"].values():
        assert c["tau"] == pytest.approx(1 + sum(c["accept_rate_per_position"]))
        assert c["speedup_full"] == pytest.approx(c["tau"] * 15.0 / 20.0)  # 1 + gamma = 5 tokens: the 4-token step
    calibration = report["by_temperature"]["1"]["calibration"]
    assert len(calibration["ece_after"]) == report["gamma"] and report["by_temperature"]["1"]["eval_rounds"] > 0
    text = md.read_text()
    assert "| writing |" in text and "| macro |" in text and "speedup T=0" in text and "ECE STS" in text
    assert text in capsys.readouterr().out
    assert sts.is_file()


def test_cli_refuses_an_unknown_bench(tmp_path, capsys):
    assert main(["--target", "t", "--draft", "d", "--bench", "no-such-bench"]) == 2
    assert "unknown prompt source" in capsys.readouterr().err


def test_a_count_suffix_keeps_the_first_prompts_of_each_category(tmp_path):
    from sglang_dspark.evaluate import bench_prompts

    bench = tmp_path / "bench.jsonl"
    rows = [("a", "p1"), ("b", "p2"), ("a", "p3"), ("a", "p4"), ("b", "p5")]
    bench.write_text("\n".join(json.dumps({"domain": d, "prompt": p}) for d, p in rows) + "\n")
    kept = bench_prompts(f"{bench}:2")
    assert [(r.domain, r.prompt) for r in kept] == [("a", "p1"), ("b", "p2"), ("a", "p3"), ("b", "p5")]
    assert len(bench_prompts(str(bench))) == 5
    mt_bench = bench_prompts("mt-bench:3")
    assert len(mt_bench) == 24 and len({r.domain for r in mt_bench}) == 8
